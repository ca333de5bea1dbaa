"""Global-norm gradient clipping over sharded gradients: every gradient element counted once.

The global norm is sqrt(sum of every gradient element squared) of the whole model. In simulation a
ParallelModel's gradients are global tensors, so each is summed whole. Under msrun each process
holds its shard of each gradient (with ZeRO-1, its optimizer slice), and the same shard lies on
every process along the mesh axes the gradient's layout does not split (data parallelism, a
replicated parameter under tensor parallelism): summing every process's squares would count such
an element once per replica, and summing only this process's would miss the other shards. Here a
process counts a gradient's squares only if it is the first replica of its shard (coordinate 0 on
every mesh axis the layout leaves unsplit), and one all-reduce of the scalar over the mesh's
processes adds the shards of every tensor, data, sequence, expert or ZeRO axis. Squares are summed
in float64, so the norm is within float32 rounding of `mindspore.ops.clip_by_global_norm`'s.
That all-reduce goes through the model's `GradientSync` (`sum_scalar`), so the report lists it in
every mode: one AllReduce of 8 bytes over the whole mesh per norm, caused "clip grad norm" (or
"grad norm" for a step that keeps the norm without clipping); in simulation it is what each
device would run, nothing moving in the one process.

`mindspore.ops.clip_by_global_norm` itself, called in one msrun process on that process's
gradients, sees only its shards: its norm is wrong (too small) whenever a parameter is split.
"""
from __future__ import annotations

import math
from typing import Any, List, Sequence, Tuple

import numpy as np
from mindspore import Tensor

from mindspore_hyper.comm.collective_cause import CLIP_NORM_CAUSE, GRAD_NORM_CAUSE

__all__ = ["clip_grad_norm", "grad_norm", "local_square_sum", "counted_once", "scale_to_norm", "check_max_norm",
           "square_sum"]


def check_max_norm(max_norm: Any, name: str = "max_norm") -> float:
    """`max_norm` as a float.

    Raises:
        ValueError: naming `name`, when it is not a finite number > 0.
    """
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(max_norm)) or float(max_norm) <= 0:
        raise ValueError(f"{name}={max_norm!r}: expected a finite number > 0 (the largest global gradient norm)")
    return float(max_norm)


def counted_once(layout, rank: int) -> bool:
    """Whether `rank` is the one device that counts its shard of a tensor laid out by `layout`:
    the first replica (coordinate 0 on every mesh axis that the layout does not split)."""
    used = set(layout.sharded_axes())
    coords = layout.coords(rank)
    return all(coords[a] == 0 for a in range(len(coords)) if a not in used)


def square_sum(grad) -> float:
    """The sum of `grad`'s squared elements (a Tensor or an array), accumulated in float64."""
    a = np.asarray(grad.asnumpy() if isinstance(grad, Tensor) else grad).astype(np.float64).ravel()
    return float(np.dot(a, a))


def _held_layout(grad, row):
    """The layout of what this process holds of `param`'s gradient: the parameter's shard, or
    with ZeRO-1 the optimizer slice (told apart by shape)."""
    shape = tuple(grad.shape)
    for layout in (row.layout, row.optimizer_layout):
        if shape == layout.local_shape(row.global_shape):
            return layout
    raise ValueError(
        f"grads: the gradient of {row.name!r} has shape {shape}, expected this process's shard "
        f"{row.layout.local_shape(row.global_shape)} or its ZeRO-1 optimizer slice "
        f"{row.optimizer_layout.local_shape(row.global_shape)}")


def local_square_sum(model, grads: Sequence) -> float:
    """This process's share of the squared global norm: the sum of squares of the gradients it
    counts (module docstring). `grads` are in the order of `model.optimizer_parameters()`."""
    params = list(model.network.trainable_params())
    if len(grads) != len(params):
        raise ValueError(f"grads: got {len(grads)} gradients, expected one per trainable parameter of the model "
                         f"({len(params)}, in the order of optimizer_parameters())")
    if len(model.local_ranks) == model.mesh.size:  # every device in this process (simulation): global tensors
        for param, grad in zip(params, grads):
            row = model.rows[id(param)]
            if tuple(grad.shape) != tuple(row.global_shape):
                raise ValueError(f"grads: the gradient of {row.name!r} has shape {tuple(grad.shape)}, expected the "
                                 f"parameter's global shape {tuple(row.global_shape)} (in simulation gradients are "
                                 f"global tensors)")
        return sum(square_sum(g) for g in grads)
    rank = model.local_ranks[0]
    total = 0.0
    for param, grad in zip(params, grads):
        row = model.rows[id(param)]
        if counted_once(_held_layout(grad, row), rank):
            total += square_sum(grad)
    return total


def grad_norm(model, grads: Sequence, cause: str = GRAD_NORM_CAUSE) -> float:
    """The global L2 norm of a ParallelModel's gradients, each element counted once (module
    docstring); the same value on every process.

    Args:
        model: the ParallelModel (`auto_parallelize`'s result, simulation or msrun).
        grads: its gradients (Tensors or numpy arrays) in the order of
            `model.optimizer_parameters()`, as `compute_gradients` returns them (global tensors
            in simulation; this process's shards or ZeRO-1 slices under msrun).
        cause: what the model's report records the scalar all-reduce as ("clip grad norm" when
            the norm clips, "grad norm" when it is only kept).

    Returns:
        The norm (inf or nan when a gradient is not finite).
    """
    total = model.reduce_over_processes(local_square_sum(model, grads), cause)
    return math.sqrt(total) if total >= 0 else float("nan")


def clip_grad_norm(model, grads: Sequence, max_norm: float) -> Tuple[List[Tensor], float]:
    """Scale the gradients so that their global norm is at most `max_norm`, as
    `mindspore.ops.clip_by_global_norm` does on one device (each gradient times
    max_norm / max(norm, max_norm)), for gradients sharded over a ParallelModel's mesh. Every
    process must call it (under msrun it all-reduces one scalar). Also sets
    `model.last_grad_norm`.

    Args:
        model: the ParallelModel.
        grads: its gradients in the order of `model.optimizer_parameters()` (see `grad_norm`).
        max_norm: the largest global norm, > 0.

    Returns:
        (clipped gradients, the global norm before clipping). Gradients below the limit come back
        unchanged; with a non-finite norm, unchanged too (nothing to scale by).

    Raises:
        ValueError: `max_norm` is not a finite number > 0; `grads` does not have one gradient of
            this process's shape per trainable parameter.
    """
    max_norm = check_max_norm(max_norm)
    norm = grad_norm(model, grads, CLIP_NORM_CAUSE)
    model.last_grad_norm = norm
    return scale_to_norm(grads, norm, max_norm), norm


def scale_to_norm(grads: Sequence, norm: float, max_norm: float) -> List[Tensor]:
    """`grads` times max_norm / norm when norm > max_norm (else unchanged)."""
    if not math.isfinite(norm) or norm <= max_norm:
        return list(grads)
    return [g * Tensor(max_norm / norm, g.dtype) for g in grads]
