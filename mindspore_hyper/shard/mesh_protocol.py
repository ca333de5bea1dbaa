"""Mesh: what a tensor layout, a Strategy and a ContextParallel read of a device mesh.

`Layout` (layout.py) is the one implementation. It builds TensorLayouts and Strategies
(`layout("data", None)`, `layout(tensor_map=...)`), so those modules cannot import it without an
import circle; they name this protocol, which sits below all of them, as their mesh's type.
"""
from __future__ import annotations

from typing import Iterable, List, Protocol, Sequence, Tuple, Union

__all__ = ["Mesh"]


class Mesh(Protocol):
    """A device matrix with one alias per axis and a rank at each row-major position (read-only).

    `Layout` also keeps `tensor_layouts`, the per-mesh memo of `TensorLayout.from_dims`; a mesh
    without it simply builds a new TensorLayout each time.
    """

    @property
    def device_matrix(self) -> Tuple[int, ...]:
        """The size of each mesh axis, major first."""

    @property
    def alias_names(self) -> Tuple[str, ...]:
        """One unique name per mesh axis."""

    @property
    def rank_list(self) -> Tuple[int, ...]:
        """The global rank at each row-major mesh position."""

    @property
    def ranks(self) -> Tuple[int, ...]:
        """All global ranks in row-major mesh order."""

    @property
    def size(self) -> int:
        """Number of devices in the mesh."""

    @property
    def ndim(self) -> int:
        """Number of mesh axes."""

    def axis_index(self, alias: str) -> int:
        """Index of the mesh axis named `alias` (ValueError when there is none)."""

    def axis_size(self, axis: Union[int, str]) -> int:
        """Devices along one mesh axis (by index or alias)."""

    def coords(self, rank: int) -> Tuple[int, ...]:
        """Mesh coordinates (one per axis) of a global rank."""

    def rank_at(self, coords: Sequence[int]) -> int:
        """Global rank at the given mesh coordinates."""

    def axis_group(self, rank: int, axes: Iterable[Union[int, str]]) -> List[int]:
        """Ranks sharing `rank`'s coordinates on every axis except `axes`, row-major over `axes`."""

    def axis_groups(self, axes: Iterable[Union[int, str]]) -> List[List[int]]:
        """Every distinct group of `axis_group` (each rank in exactly one)."""

    def to_mindspore(self):
        """The equivalent `mindspore.parallel.Layout`."""

    def to_dict(self) -> dict:
        """device_matrix, alias_names and rank_list as plain data."""
