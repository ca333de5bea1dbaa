"""In-process collectives served by the C++ communication library's in-process transport.

Same contract as `InProcessCollectives` (selected by `set_context(sim_collectives="library")`):
the forward data really moves through `InProcessCommunicator` (its algorithms, chosen by the alpha-beta
model of the `topology` flag). Each call of a collective is one node of MindSpore's PyNative
autograd graph (MindSpore's custom autograd function `mindspore.common._Function`, torch's
`autograd.Function`, not a Cell with a custom `bprop`, so that both `mindspore.value_and_grad` and
`run_backward`, torch-style `loss.backward()`, differentiate it) whose backward implements the
backward of `mindspore_hyper.comm.collectives` (AllReduce-sum -> identity per member,
ReduceScatter -> AllGather, AllToAll -> the inverse AllToAll, AllGather -> the member's slice),
which also reports the backward traffic to the recorder.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
from mindspore import Tensor, ops
from mindspore.common import _Function

from mindspore_hyper.comm.collective_cause import current_cause
from mindspore_hyper.comm.collectives import AxisGroup, Recorder, check_members, ring_send_bytes
from mindspore_hyper.comm.inprocess_collectives import InProcessCollectives, nbytes_of

__all__ = ["LibraryCollectives"]

_GROUPS: Dict[int, object] = {}


def _group(size: int):
    from mindspore_hyper.comm.inprocess import InProcessCommunicator

    if size not in _GROUPS:
        _GROUPS[size] = InProcessCommunicator(size)
    return _GROUPS[size]


def _arrays(tensors) -> List[np.ndarray]:
    return [t.asnumpy() for t in tensors]


class _Recorded:
    """A collective over the members' tensors that reports its backward traffic once per call:
    `forward(*xs)` moves the data, `backward(xs, out, dout)` the gradients (one per member)."""

    def __init__(self, recorder: Optional[Recorder], group: AxisGroup):
        self.recorder, self.group = recorder, group
        self.cause = current_cause()  # made per call, in the forward: what its backward is recorded under

    def record(self, kind: str, input_bytes: int) -> None:
        if self.recorder is not None and self.group.records and self.group.size > 1:
            self.recorder(kind, self.group.axis, ring_send_bytes(kind, self.group.size, input_bytes), input_bytes,
                          self.cause)

    def __call__(self, *xs):
        return _LibraryNode.apply(self, *xs)


class _LibraryNode(_Function):
    """A `_Recorded` collective as one autograd node."""

    @staticmethod
    def forward(ctx, collective, *xs):  # pylint: disable=arguments-differ
        out = collective.forward(*xs)
        ctx.collective, ctx.members, ctx.single = collective, len(xs), not isinstance(out, tuple)
        ctx.save_for_backward(*xs, *((out,) if ctx.single else out))
        return out

    @staticmethod
    def backward(ctx, *dout):  # pylint: disable=arguments-differ
        saved, n = ctx.saved_tensors, ctx.members
        xs, out = saved[:n], saved[n] if ctx.single else saved[n:]
        return (None,) + tuple(ctx.collective.backward(xs, out, dout[0] if ctx.single else dout))


class _AllReduce(_Recorded):
    def __init__(self, recorder, group, op: str):
        super().__init__(recorder, group)
        self.op = op

    def forward(self, *xs):
        return Tensor(_group(len(xs)).all_reduce(_arrays(xs), self.op)[0])

    def backward(self, xs, out, dout):
        if self.op == "sum":
            return tuple(dout for _ in xs)
        if self.op == "avg":
            return tuple(dout / len(xs) for _ in xs)
        hits = [ops.cast(ops.equal(x, out), dout.dtype) for x in xs]  # max/min: to the winners
        count = hits[0]
        for h in hits[1:]:
            count = count + h
        return tuple(dout * h / count for h in hits)


class _AllGather(_Recorded):
    def __init__(self, recorder, group, dim: int, grad_partial: bool):
        super().__init__(recorder, group)
        self.dim, self.grad_partial = dim, grad_partial

    def forward(self, *xs):
        return Tensor(_group(len(xs)).all_gather(_arrays(xs), dim=self.dim)[0])

    def backward(self, xs, out, dout):
        if self.grad_partial:
            self.record("ReduceScatter", nbytes_of(dout))
        return tuple(ops.split(dout, xs[0].shape[self.dim], self.dim))


class _ReduceScatter(_Recorded):
    def __init__(self, recorder, group, dim: int, op: str):
        super().__init__(recorder, group)
        self.dim, self.op = dim, op

    def forward(self, *xs):
        return tuple(Tensor(a) for a in _group(len(xs)).reduce_scatter(_arrays(xs), dim=self.dim, op=self.op))

    def backward(self, xs, out, douts):
        self.record("AllGather", nbytes_of(douts[0]))
        gathered = Tensor(_group(len(xs)).all_gather(_arrays(douts), dim=self.dim)[0])
        if self.op == "avg":
            gathered = gathered / len(xs)
        return tuple(gathered for _ in xs)


class _AllToAll(_Recorded):
    def __init__(self, recorder, group, split_dim: int, concat_dim: int):
        super().__init__(recorder, group)
        self.split_dim, self.concat_dim = split_dim, concat_dim

    def forward(self, *xs):
        outs = _group(len(xs)).all_to_all(_arrays(xs), split_dim=self.split_dim, concat_dim=self.concat_dim)
        return tuple(Tensor(a) for a in outs)

    def backward(self, xs, out, douts):
        self.record("AllToAll", nbytes_of(douts[0]))
        back = _group(len(xs)).all_to_all(_arrays(douts), split_dim=self.concat_dim, concat_dim=self.split_dim)
        return tuple(Tensor(a) for a in back)


class LibraryCollectives(InProcessCollectives):
    """AllReduce, AllGather, ReduceScatter and AllToAll through the C++ library; the local
    helpers (slicing, Partial values, fan-out, broadcast) are inherited. Gradients of max/min
    AllReduce go to the members holding the extreme value, split evenly on ties."""

    def all_reduce(self, members: Sequence[Tensor], op: str = "sum", group: Optional[AxisGroup] = None) -> List[Tensor]:
        group = check_members(members, group, "all_reduce")
        if len(members) == 1:
            return list(members)
        out = _AllReduce(self.recorder, group, op)(*members)
        return [out] * len(members)

    def all_gather(self, members: Sequence[Tensor], dim: int, group: Optional[AxisGroup] = None,
                   grad_partial: bool = False) -> List[Tensor]:
        group = check_members(members, group, "all_gather")
        if len(members) == 1:
            return list(members)
        out = _AllGather(self.recorder, group, dim, grad_partial)(*members)
        return [out] * len(members)

    def reduce_scatter(self, members: Sequence[Tensor], dim: int, op: str = "sum",
                       group: Optional[AxisGroup] = None) -> List[Tensor]:
        group = check_members(members, group, "reduce_scatter")
        if op in ("max", "min"):  # rare (a max-partial scattered); MindSpore ops carry its gradient
            return super().reduce_scatter(members, dim, op, group)
        return list(_ReduceScatter(self.recorder, group, dim, op)(*members))

    def all_to_all(self, members: Sequence[Tensor], split_dim: int, concat_dim: int,
                   group: Optional[AxisGroup] = None) -> List[Tensor]:
        group = check_members(members, group, "all_to_all")
        return list(_AllToAll(self.recorder, group, split_dim, concat_dim)(*members))
