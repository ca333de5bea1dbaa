"""`auto_parallelize(model, strategy_or_config, mode=None)`: one declaration, three runtimes.

- "simulation": `mindspore_hyper.sim.parallelize.simulate(model, strategy, **kwargs)` (N virtual
  devices in one process).
- "native": the strategy is resolved (`resolve_strategy`) and translated to MindSpore's own
  semi-auto parallel (`mindspore_hyper.shard.native.apply_native`); needs Ascend/GPU to run.
- "distributed": not available yet.
"""
from __future__ import annotations

import os
from typing import Union

from mindspore_hyper.context import MODES, get_context
from mindspore_hyper.shard.config import ParallelConfig, load_parallel_config
from mindspore_hyper.shard.strategy import Strategy

__all__ = ["auto_parallelize"]

StrategyLike = Union[Strategy, ParallelConfig, dict, str, os.PathLike]


def auto_parallelize(model, strategy_or_config: StrategyLike, mode: str = None, **kwargs):
    """Apply a parallel strategy to `model` for the chosen execution mode.

    Args:
        model: the `mindspore.nn.Cell` to parallelize.
        strategy_or_config: a Strategy (`layout(tensor_map=..., optimizer_state=...)`), a
            ParallelConfig, or a YAML path / mapping accepted by `load_parallel_config`.
        mode: "simulation", "native" or "distributed"; None reads `get_context("mode")`.
        **kwargs: passed to the runtime: `simulate(...)` in simulation mode; in native mode
            `activation_ndim`, `input_ndims`, `pipeline_scheduler`, `parallel_mode`,
            `optimizer_states` (see `apply_native` and `resolve_strategy`).

    Returns:
        simulation: the Cell returned by `simulate`; native: the `AutoParallel`-wrapped net (with
        `hyper_native_plan` and `hyper_strategy_table` attributes).

    Raises:
        ValueError: unknown mode, or an invalid strategy/config (the message names the field).
        NotImplementedError: mode "distributed".
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
    if mode == "simulation":
        from mindspore_hyper.sim.parallelize import simulate

        return simulate(model, strategy_or_config, **kwargs)
    if mode == "distributed":
        raise NotImplementedError(
            "auto_parallelize(mode='distributed') is not implemented yet: run under msrun is planned; use "
            "mode='simulation' on one machine, or mode='native' with MindSpore's own parallelism on Ascend")
    from mindspore_hyper.shard.native import apply_native
    from mindspore_hyper.shard.resolve import resolve_strategy

    resolve_kwargs = {k: kwargs.pop(k) for k in ("optimizer_states",) if k in kwargs}
    allowed = ("activation_ndim", "input_ndims", "pipeline_scheduler", "parallel_mode")
    unknown = [k for k in kwargs if k not in allowed]
    if unknown:
        raise TypeError(f"auto_parallelize(mode='native'): unexpected keyword {unknown[0]!r}; expected one of "
                        f"{allowed + ('optimizer_states',)}")
    table = resolve_strategy(model, strategy_or_config, **resolve_kwargs)
    return apply_native(model, table, **kwargs)
