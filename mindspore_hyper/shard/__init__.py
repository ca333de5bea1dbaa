"""HyperShard: layouts, placements, strategies, redistribution planning."""
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.placement import Partial, Placement, Replicate, Shard
from mindspore_hyper.shard.redistribute import (
    AllGather, AllReduce, AllToAll, LocalSlice, MakePartial, PlanStep, RedistributionPlan, ReduceScatter,
    plan_redistribution,
)
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = [
    "Layout", "TensorLayout", "Placement", "Shard", "Replicate", "Partial",
    "plan_redistribution", "RedistributionPlan", "PlanStep",
    "AllGather", "AllToAll", "ReduceScatter", "AllReduce", "LocalSlice", "MakePartial",
]
from mindspore_hyper.shard.strategy import ParamPlacement, Strategy  # noqa: E402
from mindspore_hyper.shard.process_groups import ConfigError, DeviceGroup, parse_ranks  # noqa: E402
from mindspore_hyper.shard.config import ModuleEntry, ParallelConfig, ParameterEntry, load_parallel_config  # noqa: E402
from mindspore_hyper.shard.resolve import ParamRow, StrategyTable, assign_pipeline_stages, resolve_strategy  # noqa: E402

__all__ += [
    "Strategy", "ParamPlacement", "ConfigError", "DeviceGroup", "parse_ranks", "ModuleEntry", "ParallelConfig",
    "ParameterEntry", "load_parallel_config", "ParamRow", "StrategyTable", "assign_pipeline_stages",
    "resolve_strategy",
]
from mindspore_hyper.shard.native import NativePlan, apply_native, native_mesh  # noqa: E402

__all__ += ["NativePlan", "apply_native", "native_mesh"]
