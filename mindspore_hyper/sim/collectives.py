"""Simulated collectives over the virtual devices of one mesh-axis group, as differentiable
MindSpore ops (so `ms.grad` / `ms.value_and_grad` flow through them).

Every function takes the group members' tensors ordered by their coordinate on the axis and
returns one tensor per member. Members that end with identical values share one tensor object
(the simulation stores each distinct shard once). `SimCollectives` is the single interface the
runtime calls; another backend (e.g. the C++ communication library) can implement the same
methods.
"""
from __future__ import annotations

from typing import List, Sequence

from mindspore import Tensor, ops

__all__ = ["SimCollectives", "reduce_tensors"]


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


class SimCollectives:
    """In-process collectives: each call sees every member's tensor of one group."""

    def all_reduce(self, tensors: Sequence[Tensor], op: str = "sum") -> List[Tensor]:
        out = reduce_tensors(tensors, op)
        return [out] * len(tensors)

    def all_gather(self, tensors: Sequence[Tensor], dim: int) -> List[Tensor]:
        out = ops.concat(list(tensors), dim) if len(tensors) > 1 else tensors[0]
        return [out] * len(tensors)

    def reduce_scatter(self, tensors: Sequence[Tensor], dim: int, op: str = "sum") -> List[Tensor]:
        n = len(tensors)
        chunks = [ops.split(t, t.shape[dim] // n, dim) for t in tensors]
        return [reduce_tensors([c[j] for c in chunks], op) for j in range(n)]

    def all_to_all(self, tensors: Sequence[Tensor], split_dim: int, concat_dim: int) -> List[Tensor]:
        n = len(tensors)
        chunks = [ops.split(t, t.shape[split_dim] // n, split_dim) for t in tensors]
        return [ops.concat([c[j] for c in chunks], concat_dim) for j in range(n)]

    def broadcast(self, tensors: Sequence[Tensor], root: int = 0) -> List[Tensor]:
        return [tensors[root]] * len(tensors)

    def send_recv(self, tensors: Sequence[Tensor], src: int, dst: int) -> List[Tensor]:
        """Member `dst` receives member `src`'s tensor; the others keep their own."""
        out = list(tensors)
        out[dst] = tensors[src]
        return out

    @staticmethod
    def local_slice(tensor: Tensor, parts: int, dim: int) -> List[Tensor]:
        """Split one tensor into `parts` chunks along `dim` (no communication)."""
        if parts == 1:
            return [tensor]
        return list(ops.split(tensor, tensor.shape[dim] // parts, dim))

    @staticmethod
    def make_partial(tensor: Tensor, parts: int, op: str) -> List[Tensor]:
        """Replicated values -> Partial(op) values: for sum, members other than 0 hold zeros."""
        if op != "sum":
            return [tensor] * parts
        zero = ops.zeros_like(tensor)
        return [tensor] + [zero] * (parts - 1)
