"""The global gradient norm of an MPMD model, every gradient element counted once.

The global norm is sqrt(sum of every gradient element squared) over the whole model, as
`mindspore.ops.clip_by_global_norm` computes it on one device. The device groups hold disjoint
Cells (`place_groups` refuses a Cell in two groups), so the squared norm is the sum over the
groups of their parameters' squared gradients.

In one process (simulation) each group's model returns global gradients, and the model's
trainable parameters are listed once each (a Parameter two Cells share appears once, its
gradient the sum of both uses): each is summed whole, in float64 (within float32 rounding of
MindSpore's float32 norm).

Under msrun a process holds only its own group's gradients, each its shard by the group's
layout. Within the group a process counts a shard only if it is the shard's first replica
(`runtime/grad_clip.counted_once`, on the group's own mesh), so the shares of all the job's
processes add up to the squared norm with every element once; one float64 AllReduce over the
job's mesh through the model's `norm_sync` (a `GradientSync` on the runtime's `Collectives`) sums
them, the same total on every process. The report lists that AllReduce (8 bytes in per device;
caused "clip grad norm", or "grad norm" when the step keeps the norm without clipping), in
simulation as the collective each device would run.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from mindspore import Tensor

from mindspore_hyper.comm.collective_cause import GRAD_NORM_CAUSE
from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.runtime.grad_clip import local_square_sum

__all__ = ["mpmd_grad_norm"]


def mpmd_grad_norm(model, grads: Sequence, cause: str = GRAD_NORM_CAUSE) -> float:
    """The global L2 norm of an MPMDModel's gradients (module docstring); under msrun every
    process must call it (one all-reduce of a scalar).

    Args:
        model: the MPMDModel.
        grads: one gradient (Tensor or numpy array) per entry of
            `model.network.trainable_params()`, in that order: the global gradient in
            simulation; under msrun this process's group's shards (other groups' entries are
            not read).
        cause: what the report records the scalar all-reduce as ("clip grad norm" when the norm
            clips, "grad norm" when it is only kept).

    Returns:
        The norm (inf or nan when a gradient is not finite).

    Raises:
        ValueError: a count or a shape that does not match the model's trainable parameters.
    """
    params = list(model.network.trainable_params())
    if len(grads) != len(params):
        raise ValueError(f"grads: got {len(grads)} gradients, expected one per trainable parameter of the model "
                         f"({len(params)}, in the order of model.network.trainable_params())")
    mesh = model.config.mesh
    ranks = tuple(range(mesh.size))
    if model.runtime.in_one_process():
        share = sum(_square_sum(param, grad) for param, grad in zip(params, grads))
        held = ranks
    else:
        by_id = {id(p): g for p, g in zip(params, grads)}
        share = 0.0
        for runner in model.runners.values():  # a group's models exist in its member processes only
            for cell_model in runner.models.values():
                cell_grads = [by_id[id(p)] for p in cell_model.network.trainable_params()]
                share += local_square_sum(cell_model, cell_grads)
        held = (model.runtime.processes.rank,)
    group = AxisGroup("+".join(mesh.alias_names), ranks, tuple(ranks.index(r) for r in held))
    total = model.norm_sync.sum_scalar(share, group, cause)
    return math.sqrt(total) if total >= 0 else float("nan")


def _square_sum(param, grad) -> float:
    a = np.asarray(grad.asnumpy() if isinstance(grad, Tensor) else grad)
    if a.shape != tuple(param.shape):
        raise ValueError(f"grads: the gradient of {param.name!r} has shape {a.shape}, expected the parameter's "
                         f"shape {tuple(param.shape)}")
    a = a.astype(np.float64).ravel()
    return float(np.dot(a, a))
