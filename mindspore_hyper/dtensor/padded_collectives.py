"""Collectives on uneven shards: each member's piece padded to the largest, then trimmed.

A layout that does not divide a dimension gives its devices torch.chunk pieces
(`shard.chunking`): ceil(size / devices) rows, the trailing devices fewer or none. The
collectives backends move equal pieces (MindSpore's and the library's collectives need them),
so, as torch's DTensor does, one redistribution step on such pieces pads each member's piece
with zeros to the largest along the dimensions it moves, runs the backend's collective, and cuts
the padding off the results. Padding and cutting are differentiable MindSpore ops, so gradients
flow back through the same steps. Steps that move no piece of an uneven dimension pass through.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

from mindspore import Tensor, ops

from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["PaddedCollectives"]


def _pad(t: Tensor, dim: int, size: int) -> Tensor:
    """`t` with zeros appended along `dim` up to `size` elements."""
    have = t.shape[dim]
    if have == size:
        return t
    shape = list(t.shape)
    shape[dim] = size - have
    return ops.concat([t, ops.zeros(tuple(shape), t.dtype)], dim)


def _take(t: Tensor, dim: int, start: int, length: int) -> Tensor:
    """Elements [start, start + length) of `t` along `dim`. An empty piece is the empty part of
    a split (MindSpore's CPU StridedSliceGrad fails on an empty slice; a split's backward is a
    concat): it stays in the graph, so under msrun the backward reaches, with a zero gradient,
    the collective that made `t` on a rank whose piece is empty, as every other rank's does."""
    if start == 0 and length == t.shape[dim]:
        return t
    if length == 0:
        return ops.split(t, [t.shape[dim], 0], dim)[1]
    return t[(slice(None),) * dim + (slice(start, start + length),)]


def _unpad(t: Tensor, dim: int, step: int, lengths: Sequence[int]) -> Tensor:
    """The real parts of `t`'s pieces of `step` elements along `dim` (piece j holds `lengths[j]`)."""
    parts = [_take(t, dim, j * step, n) for j, n in enumerate(lengths) if n]
    if not parts:
        return _take(t, dim, 0, 0)
    return parts[0] if len(parts) == 1 else ops.concat(parts, dim)


class PaddedCollectives:
    """The backend's collectives for one redistribution step from `before` to `after` on a
    tensor of `global_shape` (see module docstring).

    Args:
        backend: the run's collectives.
        before: the layout the step starts from.
        after: the layout the step makes.
        global_shape: the tensor's global shape.
    """

    def __init__(self, backend, before: TensorLayout, after: TensorLayout, global_shape: Tuple[int, ...]):
        self._backend = backend
        self._before = before
        self._after = after
        self._shape = global_shape

    def _lengths(self, layout: TensorLayout, dim: int, group: AxisGroup) -> List[int]:
        """Each group member's piece length along `dim` under `layout`."""
        mesh = layout.mesh
        return [layout.dim_bounds(dim, self._shape[dim], mesh.coords(r))[1] for r in group.ranks]

    def all_gather(self, members: Sequence[Tensor], dim: int, group: AxisGroup,
                   grad_partial: bool = False) -> List[Tensor]:
        lengths = self._lengths(self._before, dim, group)
        step = max(lengths)
        if min(lengths) == step:
            return self._backend.all_gather(members, dim, group, grad_partial=grad_partial)
        outs = self._backend.all_gather([_pad(m, dim, step) for m in members], dim, group, grad_partial=grad_partial)
        return self._each(outs, lambda out: _unpad(out, dim, step, lengths))

    def local_slice(self, tensor: Tensor, dim: int, group: AxisGroup, record: bool = True) -> List[Tensor]:
        lengths = self._lengths(self._after, dim, group)
        step = max(lengths)
        if min(lengths) == step:
            return self._backend.local_slice(tensor, dim, group, record=record)
        parts = self._backend.local_slice(_pad(tensor, dim, step * group.size), dim, group, record=record)
        return [_take(p, dim, 0, lengths[i]) for p, i in zip(parts, group.local)]

    def reduce_scatter(self, members: Sequence[Tensor], dim: int, op: str, group: AxisGroup) -> List[Tensor]:
        lengths = self._lengths(self._after, dim, group)
        step = max(lengths)
        if min(lengths) == step:
            return self._backend.reduce_scatter(members, dim, op, group)
        outs = self._backend.reduce_scatter([_pad(m, dim, step * group.size) for m in members], dim, op, group)
        return [_take(o, dim, 0, lengths[i]) for o, i in zip(outs, group.local)]

    def all_to_all(self, members: Sequence[Tensor], split_dim: int, concat_dim: int,
                   group: AxisGroup) -> List[Tensor]:
        sent = self._lengths(self._before, concat_dim, group)  # each member's piece of concat_dim
        kept = self._lengths(self._after, split_dim, group)  # each member's piece of split_dim after
        step_c, step_s = max(sent), max(kept)
        if min(sent) == step_c and min(kept) == step_s:
            return self._backend.all_to_all(members, split_dim, concat_dim, group)
        padded = [_pad(_pad(m, concat_dim, step_c), split_dim, step_s * group.size) for m in members]
        outs = self._backend.all_to_all(padded, split_dim, concat_dim, group)
        return [_take(_unpad(o, concat_dim, step_c, sent), split_dim, 0, kept[i]) for o, i in zip(outs, group.local)]

    @staticmethod
    def _each(outs: Sequence[Tensor], trim) -> List[Tensor]:
        """`trim` of each result; one result object shared by several members (in process) is
        trimmed once, so the members keep sharing one tensor (and its gradient)."""
        done = {}
        for o in outs:
            if id(o) not in done:
                done[id(o)] = trim(o)
        return [done[id(o)] for o in outs]

    def __getattr__(self, name):  # all_reduce, make_partial, fan_out, broadcast: shapes unchanged
        return getattr(self._backend, name)
