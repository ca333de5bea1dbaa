"""Check a searched strategy in the simulation: memory per device and numerics vs one device.

`verify_search_result(result, gpt_class)` takes the first result a CPU simulation can run for
examples/models.py's GPT (context parallel 1, no experts, ZeRO 0, 1 or 3; the GPT layout of
`gpt_parallel_config`: data, tensor, pipeline) and runs one training step of the model in
float32 on the simulated mesh: the loss must equal the single-device loss, and every device's
parameter, gradient and optimizer-state bytes must equal the estimate of its stage (float32, no
master weights, Adam). Sequence parallelism, recomputation, micro-batching and the schedule change
neither of these, so the simulated step runs without them (one micro-batch per data rank).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

from mindspore_hyper.estimate.crosscheck import Comparison, compare, gpt_layout_that_runs, seeded_gpt_batch
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.estimate.search import SearchResult
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["Verification", "verify_search_result", "simulation_runnable"]

MODEL_STATES = ("parameters", "gradients", "optimizer_states")


@dataclass
class Verification:
    """The simulated step of one searched strategy.

    Attributes:
        result: the search result verified.
        strategy: the layout simulated, read off its resolved strategy (`job_strategy_of`: the
            result's sizes and ZeRO stage; float32, no master weights, Adam).
        single_loss, simulated_loss: loss on one device and on the simulated mesh.
        comparisons: estimated vs simulated bytes per device of the model states.
    """

    result: SearchResult
    strategy: JobStrategy
    single_loss: float
    simulated_loss: float
    comparisons: List[Comparison]

    @property
    def loss_relative_error(self) -> float:
        return abs(self.simulated_loss - self.single_loss) / max(abs(self.single_loss), 1e-30)

    @property
    def memory_exact(self) -> bool:
        return all(c.estimated == c.measured for c in self.comparisons)


def simulation_runnable(result: SearchResult) -> bool:
    """Whether the simulation's GPT layout covers the result's strategy."""
    st = result.strategy
    return st.context_parallel == 1 and st.expert == 1 and st.zero_stage in (0, 1, 3)


def _check_gpt_shaped(config: TransformerConfig) -> None:
    expected = {"ffn": 4 * config.hidden, "kv_heads": config.heads, "experts": 0, "bias": True, "norm": "layernorm",
                "gated_mlp": False, "learned_positions": True, "tied_embeddings": False}
    for name, value in expected.items():
        if getattr(config, name) != value:
            raise ValueError(f"verify: the simulated model is examples/models.py's GPT; the config's {name}="
                             f"{getattr(config, name)!r} differs from its {value!r}")


def verify_search_result(results: Sequence[SearchResult], gpt_class, seed: int = 0) -> Verification:
    """Simulate the first simulation-runnable result (module doc).

    Args:
        results: search results, best first.
        gpt_class: examples/models.py's GPT class (``GPT(vocab, hidden, heads, layers, seq)``).
        seed: seeds the weights and the tokens.

    Returns:
        The Verification.

    Raises:
        ValueError: no runnable result, or a model that is not the GPT's shape.
    """
    import mindspore as ms
    from mindspore import nn

    import mindspore_hyper as mh
    from mindspore_hyper.autodiff import value_and_grad

    runnable = [r for r in results if simulation_runnable(r)]
    if not runnable:
        raise ValueError("verify: no result the simulation's GPT layout runs (it needs context parallel 1, no "
                         "experts and ZeRO 0, 1 or 3)")
    result = runnable[0]
    config = result.config
    _check_gpt_shaped(config)
    st = result.strategy
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model, ids, labels = seeded_gpt_batch(gpt_class, config, st.data, seed)
    single_loss = float(model(ids, labels).asnumpy())  # the plain Cell, before it is parallelized
    # sequence parallelism changes no model-state bytes and the GPT layout has none (module doc); Adam: 2 states
    asked = st.with_(sequence_parallel=False, optimizer_states=2)
    config_map, layout = gpt_layout_that_runs(model, asked, "verify", master_weights=False)
    loaded = mh.load_parallel_config(config_map)
    mh.set_context(mode="simulation", device_num=loaded.mesh.size)
    parallel = mh.auto_parallelize(model, loaded, pipeline=False)
    params = model.trainable_params()
    loss, _ = value_and_grad(lambda *xs: parallel(*xs), None, params)(ids, labels)
    report = parallel.report(nn.Adam(params, learning_rate=1e-3))
    simulated_loss = float(loss.asnumpy() if hasattr(loss, "asnumpy") else loss)
    fp32 = config.with_(dtype_bytes=4)
    rows = [c for c in compare(fp32, layout, report) if c.kind in MODEL_STATES]
    return Verification(result, layout, single_loss, simulated_loss, rows)
