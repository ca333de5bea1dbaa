"""Global-norm gradient clipping for models laid out by the HyperParallel API (`fully_shard`,
`hsdp`, `parallelize_module`, `distribute_module`, `Parameter(DTensor)`): upstream's
`hyper_parallel.core.utils.clip_grad_norm_` (torch's `clip_grad_norm_` on DTensor gradients).

The global norm is sqrt(sum of every gradient element squared) over the whole model. In
simulation a laid-out Parameter and its gradient are global tensors: each is summed whole. Under
msrun each process holds its piece of each gradient, and the same piece lies on every process
along the mesh axes the Parameter's layout does not split; `ops.clip_by_global_norm` on those
pieces sees only its own (too small a norm whenever a Parameter is split). Here a process counts a
piece's squares only if it is the first replica of that piece (`runtime.grad_clip.counted_once`:
coordinate 0 on every mesh axis the layout leaves unsplit), then one float64 AllReduce per mesh
(in the order the meshes first appear among the parameters, the same on every process) adds the
pieces of every sharded axis: the runtime's `GradientSync.sum_scalar`, as for the models' norms
(the mesh's report lists it: "clip grad norm", 8 bytes; nothing on a mesh of one device). A DTensor
gradient is taken as it is laid out, its Partial placements reduced first (`reduce_partial`). A
gradient of a Parameter the API did not lay out is the same on every process (replicated):
counted once, with no communication, as torch does.
Squares are summed in float64, so the norm is within float32 rounding of one device's
`ops.clip_by_global_norm`. Scaling follows MindSpore's rule (each gradient times
max_norm / max(norm, max_norm); torch uses max_norm / (norm + 1e-6) capped at 1, which differs by
~1e-6 relative). Pipeline stages on different meshes are not combined: each stage's processes get
their own stage's norm (as upstream, which leaves cross-stage norms to the user).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
from mindspore import Parameter, Tensor, nn

from mindspore_hyper.comm.collective_cause import CLIP_NORM_CAUSE, GRAD_NORM_CAUSE
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.hyper_parallel.session import mesh_of
from mindspore_hyper.runtime.gradient_sync import GradientSync
from mindspore_hyper.runtime.grad_clip import check_max_norm, counted_once, scale_to_norm, square_sum

__all__ = ["clip_grad_norm_", "clip_grads_by_global_norm", "global_grad_norm"]


def _parameter_list(parameters: Union[nn.Cell, Parameter, Iterable[Parameter]]) -> List[Parameter]:
    if isinstance(parameters, nn.Cell):
        return list(parameters.trainable_params())
    if isinstance(parameters, Tensor):
        return [parameters]
    params = list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Parameter):
            raise TypeError(f"parameters[{i}]: expected a mindspore Parameter, got {type(p).__name__} (pass the "
                            f"model, its trainable_params() or the optimizer's parameters)")
    return params


def _share(param: Parameter, grad) -> Tuple[Optional[Any], float]:
    """(the execution whose mesh the share is summed over, or None for a replicated plain
    gradient; this process's share of the squared norm from `grad`)."""
    if isinstance(grad, DTensor):
        grad = grad.reduce_partial()
        execution, layout = grad.execution, grad.layout
        return execution, sum(square_sum(grad.local_shard(r)) for r in execution.local_ranks
                              if counted_once(layout, r))
    view = mesh_of(param)
    if view is None:
        return None, square_sum(grad)
    execution = view.execution()
    slot = execution.parameters[id(param)]
    if not slot.local:  # simulation: the Parameter and its gradient are global tensors
        if tuple(grad.shape) != tuple(slot.global_shape):
            raise ValueError(f"grads: the gradient of {param.name!r} has shape {tuple(grad.shape)}, expected the "
                             f"Parameter's global shape {tuple(slot.global_shape)} (in simulation gradients are "
                             f"global tensors)")
        return execution, square_sum(grad)
    rank = execution.local_ranks[0]  # msrun: one rank per process, the gradient is its piece
    if tuple(grad.shape) != tuple(param.shape):
        raise ValueError(f"grads: the gradient of {param.name!r} has shape {tuple(grad.shape)}, expected this "
                         f"process's piece {tuple(param.shape)}")
    piece = slot.layout.shard_shape(slot.global_shape, execution.mesh.coords(rank))
    if math.prod(piece) == 0 or not counted_once(slot.layout, rank):  # an empty piece stores one zero row
        return execution, 0.0
    return execution, square_sum(grad)


def global_grad_norm(parameters: Union[nn.Cell, Parameter, Iterable[Parameter]],
                     grads: Optional[Sequence] = None, cause: str = GRAD_NORM_CAUSE) -> float:
    """The L2 norm of the gradients of `parameters` as one device would compute it, each element
    counted once (module docstring); the same value on every process of a mesh. Every process
    must call it (under msrun it all-reduces one float64 per mesh).

    Args:
        parameters: a Cell (its trainable Parameters), one Parameter or an iterable of them.
        grads: their gradients in the same order (`mindspore.value_and_grad`'s); None: each
            Parameter's `main_grad` when set (fully_shard's fp32 policy), else its `.grad`
            (`loss.backward()`); Parameters with neither are skipped.
        cause: what the mesh's report records the norm's AllReduce as ("clip grad norm" when
            the norm clips, "grad norm" when it is only read).

    Returns:
        The norm (inf or nan when a gradient is not finite).

    Raises:
        ValueError: `grads` does not have one gradient per Parameter, or a gradient's shape is not
            the Parameter's (global in simulation, this process's piece under msrun).
    """
    params = _parameter_list(parameters)
    if grads is None:
        pairs = [(p, g) for p, g in ((p, _held_grad(p)) for p in params) if g is not None]
    else:
        grads = list(grads)
        if len(grads) != len(params):
            raise ValueError(f"grads: got {len(grads)} gradients, expected one per Parameter ({len(params)}, in the "
                             f"same order)")
        pairs = list(zip(params, grads))
    replicated = 0.0
    per_mesh: Dict[int, List] = {}  # id(execution) -> [execution, share], in first-seen order
    for param, grad in pairs:
        execution, share = _share(param, grad)
        if execution is None:
            replicated += share
        else:
            per_mesh.setdefault(id(execution), [execution, 0.0])[1] += share
    total = replicated
    for execution, share in per_mesh.values():
        total += _sum_over_mesh(execution, share, cause)
    return math.sqrt(total) if total >= 0 else float("nan")


def _sum_over_mesh(execution, value: float, cause: str) -> float:
    """`value` summed over the processes of `execution`'s mesh: the runtime's scalar AllReduce
    (`GradientSync.sum_scalar`, one float64 over the whole mesh), recorded in the mesh's report
    under `cause` in every mode (in simulation, where `value` is the sum already, what each
    device would run)."""
    group = execution.group(tuple(range(len(execution.mesh.device_matrix))), {})
    return GradientSync(execution.accounting, execution.collectives).sum_scalar(value, group, cause)


def _held_grad(param: Parameter):
    main = getattr(param, "main_grad", None)
    return main if main is not None else getattr(param, "grad", None)


def _scale(grad, factor: float):
    return grad * Tensor(factor, grad.dtype)


def clip_grads_by_global_norm(parameters: Union[nn.Cell, Parameter, Iterable[Parameter]], grads: Sequence,
                              max_norm: float) -> Tuple[tuple, float]:
    """`mindspore.ops.clip_by_global_norm` for the gradients `mindspore.value_and_grad` returns
    on a model laid out by the HyperParallel API: the norm counts each element once across the
    processes (module docstring), then each gradient is scaled by max_norm / max(norm, max_norm).

    Args:
        parameters: the Parameters the gradients belong to (a Cell, or the optimizer's
            `parameters` passed to value_and_grad), in the gradients' order.
        grads: their gradients.
        max_norm: the largest global norm, > 0.

    Returns:
        (the clipped gradients as a tuple, the global norm before clipping as a float). With a
        non-finite norm the gradients come back unchanged.

    Raises:
        ValueError: `max_norm` is not a finite number > 0, or `grads` does not match `parameters`.
    """
    max_norm = check_max_norm(max_norm)
    norm = global_grad_norm(parameters, grads, CLIP_NORM_CAUSE)
    return tuple(scale_to_norm(grads, norm, max_norm)), norm


def clip_grad_norm_(parameters: Union[nn.Cell, Parameter, Iterable[Parameter]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
    """Upstream's (and torch's) `clip_grad_norm_`: scale each Parameter's held gradient
    (`main_grad` when set, else `.grad`, as `loss.backward()` leaves them) so that their global
    norm, each element counted once across the processes, is at most `max_norm`. Every process
    must call it.

    Args:
        parameters: a Cell (its trainable Parameters), one Parameter or an iterable of them.
        max_norm: the largest global norm, > 0.
        norm_type: 2.0 (the L2 norm; other orders are refused).
        error_if_nonfinite: raise when the norm is inf or nan (else the gradients are left as
            they are).

    Returns:
        The global norm before clipping, a float32 scalar Tensor.

    Raises:
        ValueError: `max_norm` is not a finite number > 0, `norm_type` is not 2, or no Parameter
            holds a gradient.
        RuntimeError: `error_if_nonfinite` and the norm is not finite.
    """
    max_norm = check_max_norm(max_norm)
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float)) or float(norm_type) != 2.0:
        raise ValueError(f"norm_type={norm_type!r}: only 2.0 (the L2 norm, MindSpore's clip_by_global_norm) is "
                         f"supported")
    params = [p for p in _parameter_list(parameters) if _held_grad(p) is not None]
    if not params:
        raise ValueError("parameters: no Parameter holds a gradient (.grad or .main_grad): run loss.backward() "
                         "after enable_mindspore_backward_compat(), or pass value_and_grad's gradients to "
                         "clip_grads_by_global_norm(parameters, grads, max_norm)")
    norm = global_grad_norm(params, cause=CLIP_NORM_CAUSE)
    if not math.isfinite(norm):
        if error_if_nonfinite:
            raise RuntimeError(f"clip_grad_norm_: the global gradient norm is {norm}, it cannot be clipped "
                               f"(error_if_nonfinite=True)")
        return Tensor(np.float32(norm))
    if norm > max_norm:
        for p in params:
            if getattr(p, "main_grad", None) is not None:
                p.main_grad = _scale(p.main_grad, max_norm / norm)
            if getattr(p, "grad", None) is not None:
                p.grad = _scale(p.grad, max_norm / norm)
    return Tensor(np.float32(norm))
