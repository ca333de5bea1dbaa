"""DryRunCollectives: the collectives of a dry run, on MetaTensors.

Each call returns the members' result shapes and moves nothing. Forward traffic is recorded by
the redistribution planner as in every runtime; the backward of each collective (the table in
`mindspore_hyper.comm.collectives`) is recorded at once when a trainable parameter reaches the
tensor (`MetaTensor.grad_path`), the same kind, group and bytes the simulation records when the
gradient passes through it.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

from mindspore import Tensor

from mindspore_hyper.comm.collective_cause import current_cause
from mindspore_hyper.comm.collectives import AxisGroup, ring_send_bytes
from mindspore_hyper.dtensor.meta import MetaTensor, meta

__all__ = ["DryRunCollectives", "as_meta"]


def as_meta(tensor: Tensor) -> MetaTensor:
    """`tensor` as a MetaTensor (itself if it is one; a plain tensor's shape and dtype, its data untouched)."""
    if isinstance(tensor, MetaTensor):
        return tensor
    return meta(tuple(tensor.shape), tensor.dtype, grad_path=bool(getattr(tensor, "requires_grad", False)))


def _resized(t: Tensor, dim: int, factor: float) -> MetaTensor:
    shape = list(t.shape)
    size = shape[dim] * factor
    if size != int(size):
        raise ValueError(f"dimension {dim} of shape {tuple(t.shape)} does not divide by the group")
    shape[dim] = int(size)
    return meta(tuple(shape), t.dtype, grad_path=getattr(t, "grad_path", False))


def _nbytes(t: Tensor) -> int:
    return math.prod(t.shape) * t.dtype.itemsize


class DryRunCollectives:
    """The Collectives protocol on shapes (see module docstring).

    Args:
        recorder: called as recorder(kind, axis, send_bytes, input_bytes, cause) for backward traffic
            (recorded as the forward runs, under its collective cause, as the simulation's backward is).
    """

    def __init__(self, recorder=None):
        self.recorder = recorder

    def _backward(self, t: Tensor, kind: str, group: AxisGroup, input_bytes: int) -> None:
        if self.recorder is None or not group.records or group.size == 1 or not getattr(t, "grad_path", False):
            return
        self.recorder(kind, group.axis, ring_send_bytes(kind, group.size, input_bytes), input_bytes, current_cause())

    def all_reduce(self, members: Sequence[Tensor], op: str, group: AxisGroup) -> List[Tensor]:
        return [as_meta(m) for m in members]

    def all_gather(self, members: Sequence[Tensor], dim: int, group: AxisGroup,
                   grad_partial: bool = False) -> List[Tensor]:
        outs = [_resized(as_meta(m), dim, group.size) for m in members]
        if grad_partial and outs:
            self._backward(outs[0], "ReduceScatter", group, _nbytes(outs[0]))
        return outs

    def reduce_scatter(self, members: Sequence[Tensor], dim: int, op: str, group: AxisGroup) -> List[Tensor]:
        outs = [_resized(as_meta(m), dim, 1 / group.size) for m in members]
        if outs:
            self._backward(outs[0], "AllGather", group, _nbytes(outs[0]))
        return outs

    def all_to_all(self, members: Sequence[Tensor], split_dim: int, concat_dim: int,
                   group: AxisGroup) -> List[Tensor]:
        outs = [_resized(_resized(as_meta(m), split_dim, 1 / group.size), concat_dim, group.size) for m in members]
        if outs:
            self._backward(outs[0], "AllToAll", group, _nbytes(outs[0]))
        return outs

    def local_slice(self, tensor: Tensor, dim: int, group: AxisGroup, record: bool = True) -> List[Tensor]:
        part = _resized(as_meta(tensor), dim, 1 / group.size)
        outs = [meta(tuple(part.shape), part.dtype, part.grad_path) for _ in group.local]
        if record and outs:
            self._backward(outs[0], "AllGather", group, _nbytes(outs[0]))
        return outs

    def make_partial(self, tensor: Tensor, op: str, group: AxisGroup) -> List[Tensor]:
        return [as_meta(tensor) for _ in group.local]

    def fan_out(self, tensor: Tensor, group: AxisGroup) -> Tensor:
        out = as_meta(tensor)
        self._backward(out, "AllReduce", group, _nbytes(out))
        return out

    def broadcast(self, members: Sequence[Tensor], root: int, group: Optional[AxisGroup] = None) -> List[Tensor]:
        return [as_meta(m) for m in members]
