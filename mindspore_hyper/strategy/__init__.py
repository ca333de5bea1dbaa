"""Strategies: what each parameter, input and Cell of a model gets on the mesh.

A `Strategy` (the seed's `layout(tensor_map=..., optimizer_state=...)`; the declaration itself is
algebra, `mindspore_hyper.shard.model_strategy`, re-exported here), the YAML `parallel_config` /
`process_groups`, and `resolve_strategy`, which turns either into the per-parameter
`StrategyTable` that every runtime consumes.
"""
from mindspore_hyper.shard.model_strategy import ParamLayout, Strategy
from mindspore_hyper.strategy.config import ModuleEntry, ParallelConfig, ParameterEntry, load_parallel_config
from mindspore_hyper.strategy.process_groups import ConfigError, DeviceGroup, parse_ranks
from mindspore_hyper.strategy.resolve import ParamRow, StrategyTable, assign_pipeline_stages, resolve_strategy

__all__ = [
    "Strategy", "ParamLayout", "ConfigError", "DeviceGroup", "parse_ranks", "ModuleEntry", "ParallelConfig",
    "ParameterEntry", "load_parallel_config", "ParamRow", "StrategyTable", "assign_pipeline_stages",
    "resolve_strategy",
]
