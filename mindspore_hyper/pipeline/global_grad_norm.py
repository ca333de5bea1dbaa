"""The global gradient norm of a pipelined model: every gradient element counted once over all stages.

The norm is sqrt(sum of every gradient element squared) of the whole model, as
`mindspore.ops.clip_by_global_norm` computes it on one device. Stages hold disjoint Parameters;
a Parameter that several stages of one process use (tied weights, in simulation; under msrun
`stages.check_unshared` refuses one used on two ranks) gets the sum of the stages' parts before
counting (`PipelineStep` sums them by Parameter), so it is counted once. Within a stage on a
data/tensor sub-mesh the rules of runtime/grad_clip.py apply: in one process the gradients are
global tensors, each counted whole; under msrun a process counts its shard of a gradient only if
it is the shard's first replica on the stage mesh (`grad_clip.counted_once`). Each process sums
the squares it counts in float64, and the sums of all processes are added by one float64
AllReduce over the whole mesh through the model's `norm_sync` (a `GradientSync` on the runtime's
`Collectives`), so every process gets the same norm and the report lists the AllReduce (8 bytes
per device; caused "clip grad norm", or "grad norm" when the step keeps the norm without
clipping), in simulation and the dry run as the collective each device would run.
"""
from __future__ import annotations

import math
from typing import Mapping

from mindspore import Tensor

from mindspore_hyper.comm.collective_cause import GRAD_NORM_CAUSE
from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.runtime.grad_clip import counted_once, square_sum

__all__ = ["local_square_sum", "pipeline_grad_norm", "sum_over_mesh"]



def local_square_sum(model, gradients: Mapping[int, Tensor]) -> float:
    """This process's share of the squared global norm.

    Args:
        model: the PipelineModel.
        gradients: id(Parameter) -> its gradient summed over this process's stages (what
            `PipelineStep` hands the optimizer, before clipping), for the Parameters this process
            computed gradients of.

    Returns:
        The sum of squares of the gradient elements this process counts (module docstring).
    """
    if model.in_one_process:  # every stage's gradients are global tensors here
        return sum(square_sum(g) for g in gradients.values())
    layouts = {}  # id(Parameter) -> (its layout on the stage mesh, this process's rank there)
    for stage_model in model.stage_models.values():
        rank = stage_model.local_ranks[0]
        layouts.update({pid: (row.layout, rank) for pid, row in stage_model.rows.items()})
    total = 0.0
    for pid, grad in gradients.items():
        layout = layouts.get(pid)
        if layout is None or counted_once(*layout):  # a stage without sub-mesh holds its gradients whole
            total += square_sum(grad)
    return total


def sum_over_mesh(model, value: float, cause: str) -> float:
    """`value` summed over the processes of the pipelined model's whole mesh: one float64
    AllReduce through `model.norm_sync` (its `Collectives`), recorded under `cause` as each
    device's (in one process `value` is the sum already and nothing moves)."""
    ranks = tuple(range(model.mesh.size))
    held = ranks if model.in_one_process else model.held_devices  # a dry run holds representatives: all here
    group = AxisGroup("+".join(model.mesh.alias_names), ranks, tuple(ranks.index(r) for r in held))
    return model.norm_sync.sum_scalar(value, group, cause)


def pipeline_grad_norm(model, gradients: Mapping[int, Tensor], cause: str = GRAD_NORM_CAUSE) -> float:
    """The global L2 norm of a pipelined model's gradients, every element counted once; the same
    value on every process (under msrun every process must call it: one all-reduce of a scalar).

    Args:
        model: the PipelineModel.
        gradients: see `local_square_sum`.
        cause: what the report records the scalar all-reduce as ("clip grad norm" when the norm
            clips, "grad norm" when it is only kept).

    Returns:
        The norm (inf or nan when a gradient element is not finite).
    """
    total = sum_over_mesh(model, local_square_sum(model, gradients), cause)
    return math.sqrt(total) if total >= 0 else float("nan")
