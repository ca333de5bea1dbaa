"""HyperShard algebra: device meshes, tensor layouts, placements, redistribution plans, and the
model-wide `Strategy` declaration (`model_strategy.py`) that `Layout(...)(tensor_map=...)` builds.

Pure data and planning: nothing here executes a collective or imports a model (a Strategy maps
parameter names and shapes to layouts; `mindspore_hyper.strategy` resolves it against a model).
"""
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.placement import Partial, Placement, Replicate, Shard
from mindspore_hyper.shard.redistribution_plan import (
    AllGather, AllReduce, AllToAll, LocalSlice, MakePartial, PlanStep, RedistributionPlan, ReduceScatter,
    plan_redistribution,
)
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = [
    "Layout", "TensorLayout", "Placement", "Shard", "Replicate", "Partial",
    "plan_redistribution", "RedistributionPlan", "PlanStep",
    "AllGather", "AllToAll", "ReduceScatter", "AllReduce", "LocalSlice", "MakePartial",
]
