"""Simulated collectives served by the C++ communication library's in-process transport.

Same interface as `SimCollectives`; selected by `set_context(sim_collectives="library")`. The
forward data really moves through `mindspore_hyper.comm.InProcessGroup` (its algorithms, chosen
by the alpha-beta model of the `topology` flag). Each collective is a Cell with a custom `bprop`,
so gradients flow: the backward of a collective is its conjugate (AllReduce-sum -> identity per
member, ReduceScatter -> AllGather, AllToAll -> the inverse AllToAll, AllGather -> the member's
slice of the summed gradient).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
from mindspore import Tensor, nn, ops

from mindspore_hyper.sim.collectives import SimCollectives

__all__ = ["LibraryCollectives"]

_GROUPS: Dict[int, object] = {}


def _group(size: int):
    from mindspore_hyper.comm import InProcessGroup

    if size not in _GROUPS:
        _GROUPS[size] = InProcessGroup(size)
    return _GROUPS[size]


def _arrays(tensors) -> List[np.ndarray]:
    return [t.asnumpy() for t in tensors]


class _AllReduce(nn.Cell):
    def __init__(self, op: str):
        super().__init__()
        self.op = op

    def construct(self, *xs):
        return Tensor(_group(len(xs)).all_reduce(_arrays(xs), self.op)[0])

    def bprop(self, *args):
        xs, out, dout = args[:-2], args[-2], args[-1]
        if self.op == "sum":
            return tuple(dout for _ in xs)
        if self.op == "avg":
            return tuple(dout / len(xs) for _ in xs)
        hits = [ops.cast(ops.equal(x, out), dout.dtype) for x in xs]  # max/min: to the winners
        count = hits[0]
        for h in hits[1:]:
            count = count + h
        return tuple(dout * h / count for h in hits)


class _AllGather(nn.Cell):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def construct(self, *xs):
        return Tensor(_group(len(xs)).all_gather(_arrays(xs), axis=self.dim)[0])

    def bprop(self, *args):
        xs, dout = args[:-2], args[-1]
        return tuple(ops.split(dout, xs[0].shape[self.dim], self.dim))


class _ReduceScatter(nn.Cell):
    def __init__(self, dim: int, op: str):
        super().__init__()
        self.dim, self.op = dim, op

    def construct(self, *xs):
        return tuple(Tensor(a) for a in _group(len(xs)).reduce_scatter(_arrays(xs), axis=self.dim, op=self.op))

    def bprop(self, *args):
        xs, douts = args[:-2], args[-1]
        gathered = Tensor(_group(len(xs)).all_gather(_arrays(douts), axis=self.dim)[0])
        if self.op == "avg":
            gathered = gathered / len(xs)
        return tuple(gathered for _ in xs)


class _AllToAll(nn.Cell):
    def __init__(self, split_dim: int, concat_dim: int):
        super().__init__()
        self.split_dim, self.concat_dim = split_dim, concat_dim

    def construct(self, *xs):
        outs = _group(len(xs)).all_to_all(_arrays(xs), split_axis=self.split_dim, concat_axis=self.concat_dim)
        return tuple(Tensor(a) for a in outs)

    def bprop(self, *args):
        xs, douts = args[:-2], args[-1]
        back = _group(len(xs)).all_to_all(_arrays(douts), split_axis=self.concat_dim, concat_axis=self.split_dim)
        return tuple(Tensor(a) for a in back)


class LibraryCollectives(SimCollectives):
    """AllReduce, AllGather, ReduceScatter and AllToAll through the C++ library; the local
    helpers (slicing, broadcast, send/recv between in-process shards) are inherited. Gradients
    of max/min AllReduce go to the members holding the extreme value, split evenly on ties."""

    def all_reduce(self, tensors: Sequence[Tensor], op: str = "sum") -> List[Tensor]:
        if len(tensors) == 1:
            return list(tensors)
        out = _AllReduce(op)(*tensors)
        return [out] * len(tensors)

    def all_gather(self, tensors: Sequence[Tensor], dim: int) -> List[Tensor]:
        if len(tensors) == 1:
            return list(tensors)
        out = _AllGather(dim)(*tensors)
        return [out] * len(tensors)

    def reduce_scatter(self, tensors: Sequence[Tensor], dim: int, op: str = "sum") -> List[Tensor]:
        if op in ("max", "min"):  # rare (a max-partial scattered); MindSpore ops carry its gradient
            return super().reduce_scatter(tensors, dim, op)
        return list(_ReduceScatter(dim, op)(*tensors))

    def all_to_all(self, tensors: Sequence[Tensor], split_dim: int, concat_dim: int) -> List[Tensor]:
        return list(_AllToAll(split_dim, concat_dim)(*tensors))
