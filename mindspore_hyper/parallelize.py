"""`auto_parallelize(model, strategy_or_config, mode=None)`: one declaration, three runtimes.

The runtime of the mode (`mindspore_hyper.runtime.get_runtime`) wraps the model:
- "simulation": N virtual devices in one process (`SimulatedModel`);
- "distributed": one process per device under msrun (`DistributedModel`);
- "native": MindSpore's own semi-auto parallel (`apply_native`); needs Ascend/GPU to run.
"""
from __future__ import annotations

import os
from typing import Union

from mindspore_hyper.context import MODES, get_context
from mindspore_hyper.runtime.base import get_runtime
from mindspore_hyper.strategy.config import ParallelConfig, load_parallel_config
from mindspore_hyper.strategy.strategy import Strategy

__all__ = ["auto_parallelize"]

StrategyLike = Union[Strategy, ParallelConfig, dict, str, os.PathLike]


def auto_parallelize(model, strategy_or_config: StrategyLike, mode: str = None, **kwargs):
    """Apply a parallel strategy to `model` for the chosen execution mode.

    Args:
        model: the `mindspore.nn.Cell` to parallelize.
        strategy_or_config: a Strategy (`layout(tensor_map=..., optimizer_state=...)`), a
            ParallelConfig, or a YAML path / mapping accepted by `load_parallel_config`.
        mode: "simulation", "distributed" or "native"; None reads `get_context("mode")`.
        **kwargs: passed to the runtime: `return_dtensor`, `optimizer_states` in simulation and
            distributed mode; `pipeline` (PipelineOptions or a mapping of its fields: schedule,
            microbatches, chunks, layers_per_stage, ...) runs pipeline stages, as does a config
            with `pipeline: N` (see docs/mpmd.md, "Pipeline execution"); `pipeline=False` runs
            such a config as one SPMD program whose stages only place parameters; in native mode
            `example_inputs` (required), `loss_fn`, `optimizer`, `micro_batches`,
            `pipeline_scheduler`, `parallel_mode`, `optimizer_states` (see `apply_native`).

    Returns:
        simulation: a `SimulatedModel`; distributed: a `DistributedModel`; with pipeline stages
        in either: a `PipelineModel`; native: `AutoParallel` wrapping the training step (with
        `hyper_native_plan` and `hyper_strategy_table`).

    Raises:
        ValueError: unknown mode, or an invalid strategy/config (the message names the field).
    """
    if mode is None:
        mode = get_context("mode")
    if mode not in MODES:
        raise ValueError(f"auto_parallelize: mode={mode!r}; expected one of {MODES} or None (use get_context('mode'))")
    if isinstance(strategy_or_config, (dict, str, os.PathLike)):
        strategy_or_config = load_parallel_config(strategy_or_config)
    if not isinstance(strategy_or_config, (Strategy, ParallelConfig)):
        raise TypeError(f"auto_parallelize: expected a Strategy, ParallelConfig, YAML path or mapping, got "
                        f"{type(strategy_or_config).__name__}")
    if mode != "native" and isinstance(strategy_or_config, ParallelConfig) and strategy_or_config.optimizer_offload:
        raise ValueError(f"parallel_config.optimizer.offload=True: not acted on in mode={mode!r}; offload the "
                         "optimizer states with mindspore_hyper.offload.hyper_offload (it keeps parameters, "
                         "optimizer states and gradients in the tiered store), or set it to False")
    if mode != "native":
        from mindspore_hyper.runtime.pipeline import parallelize_pipeline, wants_pipeline

        pipeline = kwargs.pop("pipeline", None)
        if wants_pipeline(strategy_or_config, pipeline):
            pipelined = parallelize_pipeline(model, strategy_or_config, mode, pipeline, **kwargs)
            if pipelined is not None:
                return pipelined
    return get_runtime(mode).parallelize(model, strategy_or_config, **kwargs)
