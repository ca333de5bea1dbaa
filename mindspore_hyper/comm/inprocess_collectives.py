"""In-process collectives as MindSpore ops: every member of a group lives in this process.

The simulation's default backend. Gradients come from MindSpore's autograd of the ops below;
a member result shared by several members is one tensor object, so the gradients the members'
consumers send back are summed by autograd, which is exactly the convention of
`mindspore_hyper.comm.collectives`. What the backward would move between devices is reported to
the recorder by gradient hooks, so only gradients that really flow are counted.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

from mindspore import Tensor, ops

from mindspore_hyper import bfloat16_emulation
from mindspore_hyper.comm.collective_cause import current_cause
from mindspore_hyper.comm.collectives import AxisGroup, Recorder, check_members, on_gradient, ring_send_bytes

# a new node for the gradient hook: the Identity primitive (ops.identity, the same op, prints
# MindSpore's deprecation warning on every run)
_IDENTITY = ops.Identity()

__all__ = ["InProcessCollectives", "reduce_tensors"]


def reduce_tensors(tensors: Sequence[Tensor], op: str) -> Tensor:
    """Elementwise reduction of equally shaped tensors by sum/avg/max/min."""
    out = tensors[0]
    if op in ("sum", "avg"):
        for t in tensors[1:]:
            out = out + t
        return out / len(tensors) if op == "avg" else out
    combine = ops.maximum if op == "max" else ops.minimum if op == "min" else None
    if combine is None:
        raise ValueError(f"reduce op {op!r}: expected sum, avg, max or min")
    for t in tensors[1:]:
        out = combine(out, t)
    return out


def nbytes_of(tensor: Tensor) -> int:
    """Bytes of a tensor's data."""
    return math.prod(tensor.shape) * tensor.dtype.itemsize


class InProcessCollectives:
    """Collectives over members that are all in this process (see module docstring).

    Args:
        recorder: called as recorder(kind, axis, send_bytes, input_bytes, cause) for backward traffic.
    """

    def __init__(self, recorder: Optional[Recorder] = None):
        self.recorder = recorder

    def _on_backward(self, tensor: Tensor, kind: str, group: AxisGroup, input_bytes: int) -> Tensor:
        """Report `kind` over `group` when a gradient reaches `tensor` (returns it unchanged)."""
        if self.recorder is None or not group.records or group.size == 1:
            return tensor
        recorder, n, axis, cause = self.recorder, group.size, group.axis, current_cause()

        def hook(grad):
            recorder(kind, axis, ring_send_bytes(kind, n, input_bytes), input_bytes, cause)

        on_gradient(tensor, hook)
        return tensor

    def all_reduce(self, members: Sequence[Tensor], op: str = "sum", group: Optional[AxisGroup] = None) -> List[Tensor]:
        check_members(members, group, "all_reduce")
        out = reduce_tensors(members, op)
        return [out] * len(members)

    def all_gather(self, members: Sequence[Tensor], dim: int, group: Optional[AxisGroup] = None,
                   grad_partial: bool = False) -> List[Tensor]:
        group = check_members(members, group, "all_gather")
        out = ops.concat(list(members), dim) if len(members) > 1 else members[0]
        if grad_partial:
            out = self._on_backward(out, "ReduceScatter", group, nbytes_of(out))
        return [out] * len(members)

    def reduce_scatter(self, members: Sequence[Tensor], dim: int, op: str = "sum",
                       group: Optional[AxisGroup] = None) -> List[Tensor]:
        group = check_members(members, group, "reduce_scatter")
        n = len(members)
        chunks = [ops.split(t, t.shape[dim] // n, dim) for t in members]
        outs = [reduce_tensors([c[j] for c in chunks], op) for j in range(n)]
        outs[0] = self._on_backward(outs[0], "AllGather", group, nbytes_of(outs[0]))
        return outs

    def all_to_all(self, members: Sequence[Tensor], split_dim: int, concat_dim: int,
                   group: Optional[AxisGroup] = None) -> List[Tensor]:
        group = check_members(members, group, "all_to_all")
        n = len(members)
        chunks = [ops.split(t, t.shape[split_dim] // n, split_dim) for t in members]
        outs = [ops.concat([c[j] for c in chunks], concat_dim) for j in range(n)]
        outs[0] = self._on_backward(outs[0], "AllToAll", group, nbytes_of(outs[0]))
        return outs

    def local_slice(self, tensor: Tensor, dim: int, group: AxisGroup, record: bool = True) -> List[Tensor]:
        """Every local member's chunk; `record=False` for laying out a global tensor the first
        time (a real run starts with the shards, so nothing is gathered back)."""
        n = group.size
        parts = list(ops.split(tensor, tensor.shape[dim] // n, dim)) if n > 1 else [tensor]
        outs = [parts[i] for i in group.local]
        if record:
            outs[0] = self._on_backward(outs[0], "AllGather", group, nbytes_of(outs[0]))
        return outs

    def make_partial(self, tensor: Tensor, op: str, group: AxisGroup) -> List[Tensor]:
        if op != "sum":
            return [tensor] * len(group.local)
        zero = ops.zeros_like(tensor)
        return [tensor if i == 0 else zero for i in group.local]

    def fan_out(self, tensor: Tensor, group: AxisGroup) -> Tensor:
        if self.recorder is None or not group.records or group.size == 1:
            return tensor
        out = bfloat16_emulation.identity(_IDENTITY, tensor)  # a bfloat16 Identity: on a float32 copy
        self._on_backward(out, "AllReduce", group, nbytes_of(tensor))
        return out

    def broadcast(self, members: Sequence[Tensor], root: int = 0, group: Optional[AxisGroup] = None) -> List[Tensor]:
        check_members(members, group, "broadcast")
        return [members[root]] * len(members)
