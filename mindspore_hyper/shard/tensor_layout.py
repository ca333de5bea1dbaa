"""TensorLayout: how one tensor is laid out on a Layout's mesh (any `Mesh`, shard/mesh_protocol.py).

Two equivalent views:
- the tensor map, one entry per tensor dimension: an alias, None, or a tuple of aliases (the
  dimension split over several mesh axes, major first) — MindSpore's convention;
- placements, one per mesh axis: Shard(dim), Replicate() or Partial(op).
A tensor layout may also carry Partial axes (values still to be reduced), which MindSpore's
tensor map cannot express.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from mindspore_hyper.shard.chunking import nested_chunk_bounds
from mindspore_hyper.shard.mesh_protocol import Mesh
from mindspore_hyper.shard.placement import RANK_LOCAL, REDUCE_OPS, Partial, Placement, Replicate, Shard

__all__ = ["TensorLayout", "NONE_ALIAS"]

NONE_ALIAS = "None"  # the tensor-map entry of an unsharded dimension (MindSpore's spelling)
# bounds of the memos (layouts kept per mesh, local shapes kept per layout); past one a memo starts over
_MEMO_LIMIT = 4096
_SHAPES_PER_LAYOUT = 256

Entry = Tuple[int, ...]  # mesh axis indices splitting one tensor dimension, major first


class TensorLayout:
    """A tensor's layout on a mesh.

    Args:
        mesh: the device Layout.
        tensor_map: one entry per tensor dimension: an alias, None / "None", or a tuple of aliases.
        partial: mesh aliases (or indices) mapped to the reduce op of a Partial placement there.

    Raises:
        ValueError: unknown alias, alias used twice, partial on a sharded axis, bad reduce op.
    """

    def __init__(self, mesh: Mesh, tensor_map: Sequence = (), partial: Optional[Dict] = None):
        self._mesh = mesh
        self._dims: Tuple[Entry, ...] = tuple(_parse_entry(mesh, e, i) for i, e in enumerate(tensor_map))
        used = [a for entry in self._dims for a in entry]
        if len(used) != len(set(used)):
            twice = sorted({mesh.alias_names[a] for a in used if used.count(a) > 1})
            raise ValueError(
                f"tensor_map={tuple(tensor_map)!r}: mesh axis {twice[0]!r} used more than once in one tensor"
            )
        parsed_partial = {}
        for axis, op in (partial or {}).items():
            index = mesh.axis_index(axis) if isinstance(axis, str) else axis
            if not isinstance(index, int) or not 0 <= index < mesh.ndim:
                raise ValueError(f"partial axis {axis!r} is not an axis of {mesh}")
            if index in used:
                raise ValueError(f"partial axis {mesh.alias_names[index]!r} already shards a tensor dimension")
            if op not in REDUCE_OPS and op != RANK_LOCAL:
                raise ValueError(f"partial op {op!r} on axis {mesh.alias_names[index]!r}: expected one of {REDUCE_OPS}")
            parsed_partial[index] = op
        if len(set(parsed_partial.values())) > 1:
            raise ValueError(
                f"partial={partial!r}: the Partial axes of one tensor must share one reduce op "
                "(mixed ops would make the reduction order ambiguous)"
            )
        self._partial: Tuple[Tuple[int, str], ...] = tuple(sorted(parsed_partial.items()))
        self._shard_counts = tuple(math.prod(mesh.device_matrix[a] for a in entry) for entry in self._dims)
        # facts the dispatcher asks for on every op, fixed by the (immutable) layout: computed once
        self._sharded_axes, self._significant_axes = tuple(used), tuple(sorted(set(used) | set(parsed_partial)))
        self._local_shapes: Dict[Tuple[int, ...], Tuple[int, ...]] = {}  # even global shape -> local shape

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_dims(cls, mesh: Mesh, dims: Sequence[Sequence[int]],
                  partial: Optional[Dict[int, str]] = None) -> "TensorLayout":
        """Build from mesh axis indices per dimension (the internal form). Layouts are immutable: one
        instance per (dims, partial) is kept on the mesh (`Layout.tensor_layouts`), as ops reuse few."""
        cache = mesh.tensor_layouts if cls is TensorLayout and hasattr(mesh, "tensor_layouts") else {}
        key = (tuple(tuple(entry) for entry in dims), tuple(partial.items()) if partial else ())
        layout = cache.get(key)
        if layout is None:
            tensor_map = [tuple(mesh.alias_names[a] for a in entry) if entry else None for entry in dims]
            layout = _memo_put(cache, key, cls(mesh, tensor_map, partial))
        return layout

    @classmethod
    def from_placements(cls, mesh: Mesh, placements: Sequence[Placement], ndim: int) -> "TensorLayout":
        """Build from one placement per mesh axis. A dimension sharded by several axes is split
        major-first in mesh-axis order."""
        if len(placements) != mesh.ndim:
            raise ValueError(f"placements: expected {mesh.ndim} (one per mesh axis), got {len(placements)}")
        dims: List[List[int]] = [[] for _ in range(ndim)]
        partial = {}
        for axis, p in enumerate(placements):
            if isinstance(p, Shard):
                if not -ndim <= p.dim < ndim:
                    raise ValueError(f"placements[{axis}]={p!r}: tensor has only {ndim} dimensions")
                dims[p.dim % ndim].append(axis)
            elif isinstance(p, Partial):
                partial[axis] = p.op
            elif not isinstance(p, Replicate):
                raise ValueError(f"placements[{axis}]={p!r}: expected Shard, Replicate or Partial")
        return cls.from_dims(mesh, dims, partial)

    @classmethod
    def replicated(cls, mesh: Mesh, ndim: int) -> "TensorLayout":
        return cls.from_dims(mesh, [()] * ndim)

    def with_dims(self, dims: Sequence[Sequence[int]], partial: Optional[Dict[int, str]] = None) -> "TensorLayout":
        return TensorLayout.from_dims(self._mesh, dims, dict(self._partial) if partial is None else partial)

    def with_partial(self, partial: Dict[int, str]) -> "TensorLayout":
        return TensorLayout.from_dims(self._mesh, self._dims, partial)

    # -- views -------------------------------------------------------------------------------
    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def ndim(self) -> int:
        return len(self._dims)

    @property
    def dims(self) -> Tuple[Entry, ...]:
        """Mesh axis indices per tensor dimension, major first."""
        return self._dims

    @property
    def partial(self) -> Dict[int, str]:
        """Mesh axis index -> reduce op, for the Partial axes."""
        return dict(self._partial)

    @property
    def is_partial(self) -> bool:
        return bool(self._partial)

    @property
    def is_rank_local(self) -> bool:
        """A rank-local value's layout: each rank along the marked axes has its own tensor (of
        the layout's whole shape) and there is no global value (see `rank_local`)."""
        return any(op == RANK_LOCAL for _, op in self._partial)

    @classmethod
    def rank_local(cls, mesh: Mesh, ndim: int, axes: Sequence[int]) -> "TensorLayout":
        """The layout of a value whose ranks differ along mesh `axes` (replicated along the others)."""
        return cls.from_dims(mesh, [()] * ndim, {a: RANK_LOCAL for a in axes})

    @property
    def tensor_map(self) -> Tuple:
        """Alias view: an alias, None, or a tuple of aliases per dimension."""
        names = self._mesh.alias_names
        out = []
        for entry in self._dims:
            if not entry:
                out.append(None)
            elif len(entry) == 1:
                out.append(names[entry[0]])
            else:
                out.append(tuple(names[a] for a in entry))
        return tuple(out)

    @property
    def ms_tensor_map(self) -> Tuple:
        """MindSpore's tensor_map: mesh axes counted from the right (alias i -> ndim-1-i), -1 unsharded."""
        right = lambda a: self._mesh.ndim - 1 - a  # noqa: E731
        out = []
        for entry in self._dims:
            if not entry:
                out.append(-1)
            elif len(entry) == 1:
                out.append(right(entry[0]))
            else:
                out.append(tuple(right(a) for a in entry))
        return tuple(out)

    @property
    def placements(self) -> Tuple[Placement, ...]:
        """One placement per mesh axis.

        Raises:
            ValueError: a rank-local layout (it has no placements: no global value).
        """
        if self.is_rank_local:
            raise ValueError(f"{self}: a rank-local value has no placements (no global value)")
        out: List[Placement] = [Replicate()] * self._mesh.ndim
        for dim, entry in enumerate(self._dims):
            for a in entry:
                out[a] = Shard(dim)
        for a, op in self._partial:
            out[a] = Partial(op)
        return tuple(out)

    def shard_count(self, dim: int) -> int:
        """Number of pieces dimension `dim` is split into."""
        return self._shard_counts[dim]

    def sharded_axes(self) -> Tuple[int, ...]:
        return self._sharded_axes

    @property
    def significant_axes(self) -> Tuple[int, ...]:
        """Mesh axes along which devices' shards differ: the sharding and the Partial axes, ascending."""
        return self._significant_axes

    # -- shapes and slices -------------------------------------------------------------------
    def check_shape(self, global_shape: Sequence[int], uneven: bool = False) -> None:
        """Raise ValueError naming the dimension and axes when `global_shape` cannot be laid out.

        Args:
            global_shape: the tensor's global shape.
            uneven: accept dimensions their shard count does not divide (torch.chunk pieces, see
                `shard.chunking`); only the number of dimensions is checked then.
        """
        if len(global_shape) != self.ndim:
            raise ValueError(
                f"tensor of shape {tuple(global_shape)} has {len(global_shape)} dimensions but the "
                f"tensor map {self.tensor_map} has {self.ndim} entries"
            )
        if uneven:
            return
        for dim, size in enumerate(global_shape):
            n = self.shard_count(dim)
            if size % n:
                axes = [self._mesh.alias_names[a] for a in self._dims[dim]]
                raise ValueError(
                    f"dimension {dim} of shape {tuple(global_shape)} has size {size}, not divisible by "
                    f"{n} (mesh axis {'x'.join(axes)} = {n})"
                )

    def is_even(self, global_shape: Sequence[int]) -> bool:
        """Whether every sharded dimension of `global_shape` divides by its shard count (every
        device's shard then has the same shape)."""
        return tuple(global_shape) in self._local_shapes or all(  # in the memo: `local_shape` divided it
            size % n == 0 for size, n in zip(global_shape, self._shard_counts))

    def uneven_dims(self, global_shape: Sequence[int]) -> Tuple[int, ...]:
        """The dimensions of `global_shape` whose shard count does not divide them."""
        return tuple(d for d, (size, n) in enumerate(zip(global_shape, self._shard_counts)) if size % n)

    def local_shape(self, global_shape: Sequence[int]) -> Tuple[int, ...]:
        """Shape of each device's shard (an even layout; see `max_local_shape` for uneven ones).

        Raises:
            ValueError: a dimension does not divide by its shard count.
        """
        local = self._local_shapes.get(shape := tuple(global_shape))
        if local is None:  # a layout meets few shapes: each divided once
            self.check_shape(shape)
            local = tuple(size // n for size, n in zip(shape, self._shard_counts))
            _memo_put(self._local_shapes, shape, local, _SHAPES_PER_LAYOUT)
        return local

    def max_local_shape(self, global_shape: Sequence[int]) -> Tuple[int, ...]:
        """Shape of the largest shard (the device at coordinate 0 of every axis): each sharded
        dimension has ceil(size / shard count) elements per chunking level; the even shard shape
        when the layout divides `global_shape`."""
        self.check_shape(global_shape, uneven=True)
        return tuple(nested_chunk_bounds(size, [self._mesh.device_matrix[a] for a in entry], [0] * len(entry))[1]
                     for size, entry in zip(global_shape, self._dims))

    def dim_bounds(self, dim: int, size: int, coords: Sequence[int]) -> Tuple[int, int]:
        """(start, length) of the piece of dimension `dim` (of `size` elements) held by the device
        at mesh `coords` (torch.chunk pieces, axis by axis major first; `shard.chunking`)."""
        entry = self._dims[dim]
        return nested_chunk_bounds(size, [self._mesh.device_matrix[a] for a in entry], [coords[a] for a in entry])

    def shard_shape(self, global_shape: Sequence[int], coords: Sequence[int]) -> Tuple[int, ...]:
        """Shape of the shard held by the device at mesh `coords` (uneven layouts allowed)."""
        self.check_shape(global_shape, uneven=True)
        return tuple(self.dim_bounds(d, size, coords)[1] for d, size in enumerate(global_shape))

    def coords(self, rank: int) -> Tuple[int, ...]:
        return self._mesh.coords(rank)

    def shard_index(self, rank: int, dim: int) -> int:
        """Which piece of dimension `dim` the rank holds (mixed radix over the entry's axes)."""
        coords = self._mesh.coords(rank)
        index = 0
        for a in self._dims[dim]:
            index = index * self._mesh.device_matrix[a] + coords[a]
        return index

    def rank_slices(self, rank: int, global_shape: Sequence[int]) -> Tuple[slice, ...]:
        """The slice of the global tensor held by `rank` (torch.chunk pieces when the layout does
        not divide `global_shape`)."""
        self.check_shape(global_shape, uneven=True)
        coords = self._mesh.coords(rank)
        out = []
        for d, size in enumerate(global_shape):
            start, length = self.dim_bounds(d, size, coords)
            out.append(slice(start, start + length))
        return tuple(out)

    def replica_ranks(self, rank: int) -> List[int]:
        """Ranks holding an identical copy of `rank`'s shard (including `rank`): they differ only
        along Replicate axes."""
        free = [a for a in range(self._mesh.ndim) if a not in self.sharded_axes() and a not in self.partial]
        return self._mesh.axis_group(rank, free)

    # -- MindSpore interop -------------------------------------------------------------------
    def to_mindspore(self):
        """The equivalent `mindspore.parallel.Layout(...)(*tensor_map)` result.

        Raises:
            ValueError: the layout has Partial axes, which MindSpore's tensor map cannot express.
        """
        if self._partial:
            raise ValueError(f"{self}: Partial placements have no MindSpore tensor-map equivalent")
        entries = [NONE_ALIAS if e is None else e for e in self.tensor_map]
        return self._mesh.to_mindspore()(*entries)

    def to_dict(self) -> dict:
        return {"device_matrix": self._mesh.device_matrix, "tensor_map": self.ms_tensor_map,
                "alias_name": self._mesh.alias_names, "rank_list": list(self._mesh.rank_list),
                "partial": {self._mesh.alias_names[a]: op for a, op in self._partial}}

    def __eq__(self, other) -> bool:
        return (isinstance(other, TensorLayout) and self._mesh == other._mesh
                and self._dims == other._dims and self._partial == other._partial)

    def __hash__(self) -> int:
        return hash((self._mesh, self._dims, self._partial))

    def __repr__(self) -> str:
        partial = ""
        if self._partial:
            partial = ", partial={" + ", ".join(f"{self._mesh.alias_names[a]!r}: {op!r}" for a, op in self._partial) + "}"
        return f"TensorLayout({self.tensor_map}{partial}, mesh={self._mesh.device_matrix}{self._mesh.alias_names})"


def _memo_put(memo: dict, key, value, limit: Optional[int] = None):
    """`memo[key] = value` in a memo of at most `limit` (default `_MEMO_LIMIT`) entries, past which it
    starts over; returns `value`."""
    if len(memo) >= (_MEMO_LIMIT if limit is None else limit):
        memo.clear()
    memo[key] = value
    return value


def _parse_entry(mesh: Mesh, entry, dim: int) -> Entry:
    if entry is None or entry == NONE_ALIAS:
        return ()
    if isinstance(entry, str):
        return (_alias(mesh, entry, dim),)
    if isinstance(entry, (tuple, list)):
        axes = tuple(_alias(mesh, a, dim) for a in entry if a != NONE_ALIAS and a is not None)
        return axes
    raise ValueError(f"tensor_map[{dim}]={entry!r}: expected an alias, None, or a tuple of aliases")


def _alias(mesh: Mesh, alias, dim: int) -> int:
    if not isinstance(alias, str) or alias not in mesh.alias_names:
        raise ValueError(
            f"tensor_map[{dim}]={alias!r}: not an alias of the layout; expected one of "
            f"{mesh.alias_names} or None"
        )
    return mesh.alias_names.index(alias)
