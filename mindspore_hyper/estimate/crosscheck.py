"""The estimate against the simulation's measured accounting, device by device.

`simulate_step` runs one training step (forward + backward) of a model in simulation mode
through the public API (`set_context`, `auto_parallelize`, `report`) and returns its report;
`compare` lines the estimate of each device's pipeline stage up with that device's measured
memory. `crosscheck_gpt` does both for examples/models.py's GPT under a JobStrategy, in
simulation or (`shapes_only`) in the dry run, which reaches sizes no simulation holds.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mindspore_hyper.estimate.gpt_layout import gpt_parallel_config
from mindspore_hyper.estimate.job import estimate_stage
from mindspore_hyper.estimate.resolved_job import DERIVED_FIELDS, job_strategy_of
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["simulate_step", "compare", "crosscheck_gpt", "gpt_layout_that_runs", "Comparison", "COMPARED"]

# estimator field -> the report's memory key
COMPARED = {"parameters": "parameters", "gradients": "gradients", "optimizer_states": "optimizer_states",
            "activations": "activations_peak"}


@dataclass(frozen=True)
class Comparison:
    """One device's estimated and measured bytes of one kind."""

    rank: int
    stage: int
    kind: str
    estimated: int
    measured: int

    @property
    def relative_error(self) -> float:
        """(estimated - measured) / measured (0 when both are 0)."""
        if self.measured == 0:
            return 0.0 if self.estimated == 0 else float("inf")
        return (self.estimated - self.measured) / self.measured


def simulate_step(model, parallel_config, inputs: Sequence, optimizer: Optional[Callable] = None,
                  backward: bool = True, shapes_only: bool = False):
    """Run one step of `model` on the simulated mesh of `parallel_config`; return the report.

    Sets the context to simulation mode with the config's device count and MindSpore to
    PYNATIVE mode. The step runs as one SPMD program (`auto_parallelize(..., pipeline=False)`):
    pipeline stages only place parameters (no microbatches, no schedule), the program whose
    per-device accounting the estimator's `activation_model="simulation"` describes.

    Args:
        model: an nn.Cell; with `backward` its output must be a scalar loss.
        parallel_config: a Strategy, ParallelConfig, YAML path or mapping (as `auto_parallelize`).
        inputs: the model's inputs (global tensors).
        optimizer: factory ``params -> nn.Optimizer`` whose states the report counts (default Adam).
        backward: run `value_and_grad` (forward + backward), else the forward only.
        shapes_only: run the step in the dry-run mode (shapes and bytes only: a model built
            under `no_init_parameters()` of any size; docs/dryrun.md) with `train_step`.

    Returns:
        The `StepReport` of the step.
    """
    import mindspore as ms
    from mindspore import nn

    import mindspore_hyper as mh
    from mindspore_hyper.autodiff import value_and_grad

    ms.set_context(mode=ms.PYNATIVE_MODE)
    loaded = parallel_config if hasattr(parallel_config, "mesh") else mh.load_parallel_config(parallel_config)
    mh.set_context(mode="dryrun" if shapes_only else "simulation", device_num=loaded.mesh.size)
    parallel = mh.auto_parallelize(model, loaded, pipeline=False)
    factory = optimizer or (lambda ps: nn.Adam(ps, learning_rate=1e-3))
    if shapes_only:
        from mindspore.nn.utils import no_init_parameters

        with no_init_parameters():  # the states' shapes only
            states = factory(parallel.optimizer_parameters())
        if backward:
            parallel.train_step(states, *inputs)
        else:
            parallel(*inputs)
        return parallel.report(states)
    params = model.trainable_params()
    run = value_and_grad(lambda *xs: parallel(*xs), None, params) if backward else parallel
    run(*inputs)
    states = factory(params)
    return parallel.report(states)


def _stage_of(rank: int, report) -> int:
    from mindspore_hyper import Layout

    names = tuple(report.mesh)
    if "pipeline" not in names:
        return 0
    return Layout(tuple(report.mesh.values()), names).coords(rank)[names.index("pipeline")]


def compare(config: TransformerConfig, strategy: JobStrategy, report) -> List[Comparison]:
    """Estimated vs measured bytes for every device of `report` and every kind in COMPARED.

    A device's stage is its coordinate on the mesh's "pipeline" axis (0 without one)."""
    stages: Dict[int, object] = {}
    rows = []
    for rank, measured in sorted(report.memory.items()):
        stage = _stage_of(rank, report)
        if stage not in stages:
            stages[stage] = estimate_stage(config, strategy, stage)
        for kind, key in COMPARED.items():
            rows.append(Comparison(rank, stage, kind, int(getattr(stages[stage], kind)), int(measured[key])))
    return rows


def crosscheck_gpt(gpt_class, config: TransformerConfig, strategy: JobStrategy, seed: int = 0,
                   shapes_only: bool = False) -> List[Comparison]:
    """Build examples/models.py's GPT for `config`, simulate one training step under `strategy`
    (laid out by `gpt_parallel_config`) and compare every device with the estimate of the
    strategy that ran (`job_strategy_of` the resolved layout: the same sizes and ZeRO stage).

    Args:
        gpt_class: the GPT class (``GPT(vocab, hidden, heads, layers, seq)``).
        config: the model; micro_batch is per data-parallel rank (the step's global batch is
            micro_batch x data).
        strategy: data / tensor / pipeline sizes and ZeRO stage; its optimizer_states must be 2
            (the step's optimizer is Adam).
        seed: seeds the weights and the token ids.
        shapes_only: dry-run the step (a model of any size, never allocated) instead of
            simulating it.

    Returns:
        The comparisons (see `compare`).

    Raises:
        ValueError: optimizer_states is not 2; the GPT's resolved layout amounts to other sizes or
            another ZeRO stage than `strategy` (a layout that does not say what it was asked).
    """
    if strategy.optimizer_states != 2:
        raise ValueError(f"optimizer_states={strategy.optimizer_states}: the simulated step uses Adam (2 states)")
    model, ids, labels = seeded_gpt_batch(gpt_class, config, strategy.data, seed, lazy=shapes_only)
    others = {f.name: getattr(strategy, f.name) for f in fields(strategy) if f.name not in DERIVED_FIELDS}
    layout, ran = gpt_layout_that_runs(model, strategy, "crosscheck_gpt", **others)
    report = simulate_step(model, layout, (ids, labels), shapes_only=shapes_only)
    return compare(config, ran, report)


def gpt_layout_that_runs(model, strategy: JobStrategy, where: str, **others: Any) -> Tuple[dict, JobStrategy]:
    """The parallel config that lays examples/models.py's GPT `model` out as `strategy` says
    (`gpt_parallel_config`), and the JobStrategy its resolved layout amounts to (`job_strategy_of`:
    sizes and ZeRO stage read off the resolved table, with `others` for the remaining fields), so
    that an estimate describes the layout that runs rather than the one asked for.

    Args:
        model: the GPT (built, or lazily under `no_init_parameters()`).
        strategy: the sizes and ZeRO stage asked (its optimizer_states sizes the table).
        where: the caller's name, for messages.
        **others: the derived JobStrategy's fields other than data, tensor, pipeline, zero_stage.

    Returns:
        (the parallel config mapping, the derived JobStrategy).

    Raises:
        ValueError: the resolved layout's sizes or ZeRO stage differ from `strategy`'s (a layout
            that does not say what it was asked), or one `gpt_parallel_config` refuses.
    """
    from mindspore_hyper.strategy.resolve import resolve_strategy  # here: the estimate package imports no MindSpore

    layout = gpt_parallel_config(strategy)
    ran = job_strategy_of(resolve_strategy(model, layout, strategy.optimizer_states), **others)
    differ = [f"{name}={getattr(strategy, name)} asked, {getattr(ran, name)} laid out" for name in DERIVED_FIELDS
              if getattr(strategy, name) != getattr(ran, name)]
    if differ:
        raise ValueError(f"{where}: the GPT's resolved layout is not the strategy's: {'; '.join(differ)}")
    return layout, ran


def seeded_gpt_batch(gpt_class, config: TransformerConfig, data: int, seed: int, lazy: bool = False):
    """A `gpt_class` model of `config` with weights seeded by `seed` (`lazy`: built under
    `no_init_parameters()`, never allocated unless used), and one global batch of random token
    ids and labels (micro_batch x `data` sequences of seq_len tokens)."""
    import contextlib

    import numpy as np
    import mindspore as ms
    from mindspore import Tensor
    from mindspore.nn.utils import no_init_parameters

    ms.set_seed(seed)
    with no_init_parameters() if lazy else contextlib.nullcontext():
        model = gpt_class(vocab=config.vocab, hidden=config.hidden, heads=config.heads, layers=config.layers,
                          seq=config.seq_len)
    rng = np.random.default_rng(seed)
    shape = (config.micro_batch * data, config.seq_len)
    ids = Tensor(rng.integers(0, config.vocab, shape).astype(np.int32))
    labels = Tensor(rng.integers(0, config.vocab, shape).astype(np.int32))
    return model, ids, labels
