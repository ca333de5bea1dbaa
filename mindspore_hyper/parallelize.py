"""`auto_parallelize(model, strategy_or_config, mode=None)`: one declaration, three runtimes.

The strategy is resolved once (a StrategyTable), its program shape decided once (`program_of`:
SPMD, pipeline stages, MPMD groups), and the shape's builder wraps the model with the mode's
runtime (`RUNTIMES`, runtime/modes.py):
- "simulation": N virtual devices in one process (`SimulatedModel`);
- "distributed": one process per device under msrun (`DistributedModel`);
- "native": MindSpore's own semi-auto parallel (`apply_native`); needs Ascend/GPU to run.
"""
from __future__ import annotations

import os
from typing import Union

from mindspore_hyper.context import MODES, get_context
from mindspore_hyper.runtime.modes import RUNTIMES
from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.softmax_backward_cache import ensure_softmax_backward, model_dtypes
from mindspore_hyper.strategy.config import ParallelConfig, load_parallel_config
from mindspore_hyper.strategy.program import program_of
from mindspore_hyper.strategy.resolve import resolve_strategy

__all__ = ["auto_parallelize", "RUNTIMES"]

StrategyLike = Union[Strategy, ParallelConfig, dict, str, os.PathLike]


def auto_parallelize(model, strategy_or_config: StrategyLike, mode: str = None, **kwargs):
    """Apply a parallel strategy to `model` for the chosen execution mode.

    Args:
        model: the `mindspore.nn.Cell` to parallelize.
        strategy_or_config: a Strategy (`layout(tensor_map=..., optimizer_state=...)`), a
            ParallelConfig, or a YAML path / mapping accepted by `load_parallel_config`.
        mode: "simulation", "distributed" or "native"; None reads `get_context("mode")`.
        **kwargs: `optimizer_states` (every mode: states per parameter in the memory rows);
            in simulation and distributed mode `return_dtensor`, `group_strategies` (device
            group name -> Strategy, for a config with groups), `pipeline` (PipelineOptions or a mapping of its fields: schedule,
            microbatches, chunks, layers_per_stage, ...) runs pipeline stages, as does a config
            with `pipeline: N` (see docs/mpmd.md, "Pipeline execution"); `pipeline=False` runs
            such a config as one SPMD program whose stages only place parameters; in native mode
            `example_inputs` (required), `loss_fn`, `optimizer`, `micro_batches`,
            `pipeline_scheduler`, `parallel_mode` (see `apply_native`).

    Returns:
        simulation: a `SimulatedModel`; distributed: a `DistributedModel`; with pipeline stages
        in either: a `PipelineModel`; with device groups (hyper_mpmd on): an `MPMDModel`; native: `AutoParallel` wrapping the training step (with
        `hyper_native_plan` and `hyper_strategy_table`).

    Raises:
        ValueError: unknown mode, or an invalid strategy/config (the message names the field).
        TypeError: a keyword the mode does not take (named).
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
    runtime = RUNTIMES[mode]()
    if runtime.runs_op_by_op() and isinstance(strategy_or_config, ParallelConfig) and \
            strategy_or_config.optimizer_offload:
        raise ValueError(f"parallel_config.optimizer.offload=True: not acted on in mode={mode!r}; offload the "
                         "optimizer states with mindspore_hyper.offload.hyper_offload (it keeps parameters, "
                         "optimizer states and gradients in the tiered store), or set it to False")
    optimizer_states = kwargs.pop("optimizer_states", 2)
    table = resolve_strategy(model, strategy_or_config, optimizer_states=optimizer_states)
    if runtime.computes_values():
        ensure_softmax_backward(model_dtypes(model))
    if not runtime.runs_op_by_op():  # the mode compiles the whole program itself (native) and takes every keyword
        return runtime.parallelize(model, table, **kwargs)
    pipeline = kwargs.pop("pipeline", None)
    return_dtensor = kwargs.pop("return_dtensor", False)
    group_strategies = kwargs.pop("group_strategies", None)
    if kwargs:
        raise TypeError(f"auto_parallelize(mode={mode!r}): unexpected keyword {next(iter(kwargs))!r}; expected "
                        "optimizer_states, pipeline, return_dtensor or group_strategies")
    program = program_of(table, pipeline)
    if program.shape == "pipeline":
        from mindspore_hyper.pipeline import parallelize_pipeline

        pipelined = parallelize_pipeline(model, table, runtime, pipeline, return_dtensor)
        if pipelined is not None:
            return pipelined
        program = program.without_pipeline()
    if program.shape == "mpmd":
        from mindspore_hyper.mpmd.build import parallelize_mpmd

        return parallelize_mpmd(model, table, runtime, group_strategies, return_dtensor)
    if group_strategies:
        raise ValueError("group_strategies: the strategy declares no device groups (process_groups or "
                         "strategy: mpmd entries)")
    return runtime.parallelize(model, table, return_dtensor)
