"""Layout: a named device matrix (the mesh) on which tensors are laid out.

Follows `mindspore.parallel.Layout`: `Layout((2, 2, 2), ("data", "tensor", "pipeline"))`, called with
one entry per tensor dimension to produce a tensor layout. Constructing a Layout has no side
effects: it creates no process groups and needs no initialised communication.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.shard.tensor_layout import NONE_ALIAS, TensorLayout

__all__ = ["Layout", "NONE_ALIAS"]


class Layout:
    """A device matrix with one alias per axis and an optional mapping of mesh positions to ranks.

    Calling it with a tensor map gives a TensorLayout; the keyword form
    `layout(tensor_map=..., optimizer_state=...)` gives a model-wide `Strategy` (defined beside
    it in `shard.model_strategy`: pure data over this mesh, so nothing above the algebra is called).
    Those modules name their mesh's type by the `Mesh` protocol (`shard.mesh_protocol`), which
    Layout implements, as importing this module there would close an import circle.

    Args:
        device_matrix: positive ints, the size of each mesh axis (major first).
        alias_names: one unique, non-empty string per axis; "None" is reserved.
            (`alias_name`, MindSpore's keyword, is accepted too.)
        rank_list: the global rank at each row-major mesh position; a permutation of
            range(prod(device_matrix)). Defaults to the identity.

    Raises:
        ValueError: any of the rules above is broken (the message names the argument).
    """

    def __init__(self, device_matrix: Sequence[int], alias_names: Sequence[str] = None,
                 rank_list: Optional[Sequence[int]] = None, *, alias_name: Sequence[str] = None):
        if alias_names is None:
            alias_names = alias_name
        elif alias_name is not None:
            raise ValueError("Layout: give alias_names or alias_name, not both")
        self._device_matrix = _check_device_matrix(device_matrix)
        self._alias_names = _check_aliases(alias_names, len(self._device_matrix))
        self._size = math.prod(self._device_matrix)
        self._rank_list = _check_rank_list(rank_list, self._size)
        self._position_of_rank = {r: i for i, r in enumerate(self._rank_list)}
        self._groups_cache = {}
        self._coords_cache: Dict[int, Tuple[int, ...]] = {}
        # (dims, partial) -> the TensorLayout on this mesh (`TensorLayout.from_dims` returns one instance each)
        self.tensor_layouts: Dict[tuple, TensorLayout] = {}

    # -- basic facts -------------------------------------------------------------------------
    @property
    def device_matrix(self) -> Tuple[int, ...]:
        return self._device_matrix

    @property
    def alias_names(self) -> Tuple[str, ...]:
        return self._alias_names

    @property
    def rank_list(self) -> Tuple[int, ...]:
        return self._rank_list

    @property
    def size(self) -> int:
        """Number of devices in the mesh."""
        return self._size

    @property
    def ndim(self) -> int:
        return len(self._device_matrix)

    def axis_index(self, alias: str) -> int:
        """Index of the mesh axis named `alias`."""
        try:
            return self._alias_names.index(alias)
        except ValueError:
            raise ValueError(
                f"unknown mesh axis {alias!r}; this layout's aliases are {self._alias_names}"
            ) from None

    def axis_size(self, axis: Union[int, str]) -> int:
        return self._device_matrix[self._axis(axis)]

    def _axis(self, axis: Union[int, str]) -> int:
        if isinstance(axis, str):
            return self.axis_index(axis)
        if not 0 <= axis < self.ndim:
            raise ValueError(f"mesh axis {axis} out of range for {self.ndim} axes")
        return axis

    # -- rank <-> coordinates ----------------------------------------------------------------
    def coords(self, rank: int) -> Tuple[int, ...]:
        """Mesh coordinates (one per axis) of a global rank."""
        cached = self._coords_cache.get(rank)
        if cached is not None:
            return cached
        if rank not in self._position_of_rank:
            raise ValueError(f"rank {rank} is not in this layout's rank_list {list(self._rank_list)}")
        position = self._position_of_rank[rank]
        out = []
        for size in reversed(self._device_matrix):
            out.append(position % size)
            position //= size
        self._coords_cache[rank] = coords = tuple(reversed(out))
        return coords

    def rank_at(self, coords: Sequence[int]) -> int:
        """Global rank at the given mesh coordinates."""
        if len(coords) != self.ndim or any(not 0 <= c < s for c, s in zip(coords, self._device_matrix)):
            raise ValueError(f"coordinates {tuple(coords)} do not fit device_matrix {self._device_matrix}")
        position = 0
        for c, size in zip(coords, self._device_matrix):
            position = position * size + c
        return self._rank_list[position]

    @property
    def ranks(self) -> Tuple[int, ...]:
        """All global ranks in row-major mesh order."""
        return self._rank_list

    def axis_group(self, rank: int, axes: Iterable[Union[int, str]]) -> List[int]:
        """Ranks that share `rank`'s coordinates on every axis except `axes`, ordered row-major
        over `axes` in the order given (the process group of a collective over those axes)."""
        axes = [self._axis(a) for a in axes]
        base = list(self.coords(rank))
        group = []
        for index in range(math.prod(self._device_matrix[a] for a in axes)):
            coords = list(base)
            for a in reversed(axes):
                coords[a] = index % self._device_matrix[a]
                index //= self._device_matrix[a]
            group.append(self.rank_at(coords))
        return group

    def axis_groups(self, axes: Iterable[Union[int, str]]) -> List[List[int]]:
        """Every distinct group of `axis_group` (each rank in exactly one group)."""
        axes = tuple(self._axis(a) for a in axes)
        if axes not in self._groups_cache:
            seen, groups = set(), []
            for rank in self._rank_list:
                if rank not in seen:
                    group = self.axis_group(rank, axes)
                    seen.update(group)
                    groups.append(group)
            self._groups_cache[axes] = groups
        return [list(g) for g in self._groups_cache[axes]]

    # -- tensor layouts ----------------------------------------------------------------------
    def __call__(self, *tensor_map, **strategy_kwargs):
        """`layout("data", None)` -> TensorLayout; `layout(tensor_map=(...), optimizer_state="data")`
        -> a model-wide Strategy (the seed's keyword form)."""
        if "tensor_map" in strategy_kwargs:
            if tensor_map:
                raise ValueError("Layout(...): give the tensor map positionally or as tensor_map=, not both")
            return Strategy(self, **strategy_kwargs)
        if strategy_kwargs:
            raise ValueError(
                f"Layout(...) got keyword(s) {sorted(strategy_kwargs)} without tensor_map=; "
                "use layout(*tensor_map) for a tensor layout or layout(tensor_map=..., ...) for a strategy"
            )
        return TensorLayout(self, tensor_map)

    def to_mindspore(self):
        """The equivalent `mindspore.parallel.Layout` (pure object; no communication needed)."""
        from mindspore.parallel import Layout as MsLayout

        return MsLayout(self._device_matrix, self._alias_names, list(self._rank_list))

    def to_dict(self) -> dict:
        return {"device_matrix": self._device_matrix, "alias_names": self._alias_names,
                "rank_list": list(self._rank_list)}

    def __eq__(self, other) -> bool:
        if other is self:
            return True
        return (isinstance(other, Layout) and self._device_matrix == other._device_matrix
                and self._alias_names == other._alias_names and self._rank_list == other._rank_list)

    def __hash__(self) -> int:
        return hash((self._device_matrix, self._alias_names, self._rank_list))

    def __repr__(self) -> str:
        extra = "" if self._rank_list == tuple(range(self._size)) else f", rank_list={list(self._rank_list)}"
        return f"Layout(device_matrix={self._device_matrix}, alias_names={self._alias_names}{extra})"


def _check_device_matrix(device_matrix) -> Tuple[int, ...]:
    if not isinstance(device_matrix, (tuple, list)) or not device_matrix:
        raise ValueError(f"device_matrix={device_matrix!r}: expected a non-empty tuple of positive ints")
    for i, size in enumerate(device_matrix):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"device_matrix[{i}]={size!r}: expected a positive int")
    return tuple(device_matrix)


def _check_aliases(alias_names, ndim: int) -> Tuple[str, ...]:
    if not isinstance(alias_names, (tuple, list)):
        raise ValueError(f"alias_names={alias_names!r}: expected a tuple of strings, one per device_matrix axis")
    if len(alias_names) != ndim:
        raise ValueError(f"alias_names={tuple(alias_names)!r}: expected {ndim} names, one per device_matrix axis")
    for i, alias in enumerate(alias_names):
        if not isinstance(alias, str) or not alias:
            raise ValueError(f"alias_names[{i}]={alias!r}: expected a non-empty string")
        if alias == NONE_ALIAS:
            raise ValueError(f"alias_names[{i}]='None': 'None' is reserved for unsharded dimensions")
    if len(set(alias_names)) != len(alias_names):
        raise ValueError(f"alias_names={tuple(alias_names)!r}: aliases must be unique")
    return tuple(alias_names)


def _check_rank_list(rank_list, size: int) -> Tuple[int, ...]:
    if rank_list is None:
        return tuple(range(size))
    ranks = tuple(rank_list)
    if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks) or sorted(ranks) != list(range(size)):
        raise ValueError(f"rank_list={list(ranks)!r}: expected a permutation of range({size})")
    return ranks
