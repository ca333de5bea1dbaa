"""Small helpers shared by the sharding rules."""
from __future__ import annotations

from typing import Dict, Iterable, List, Sequence

import numpy as np

from mindspore_hyper.shard.tensor_layout import TensorLayout


def without_partial(layout: TensorLayout) -> TensorLayout:
    """Same sharding, Partial axes reduced."""
    return layout.with_partial({}) if layout.is_partial else layout


def unshard_dims(layout: TensorLayout, dims: Iterable[int], keep_partial: bool = False) -> TensorLayout:
    """`layout` with the given dimensions made whole (and Partial reduced unless kept)."""
    dims = set(d % max(layout.ndim, 1) for d in dims)
    entries = [() if d in dims else e for d, e in enumerate(layout.dims)]
    return layout.with_dims(entries, layout.partial if keep_partial else {})


def make(mesh, dims: Sequence[Sequence[int]], partial: Dict[int, str] = None) -> TensorLayout:
    return TensorLayout.from_dims(mesh, dims, partial or {})


def free_entry(entry: Sequence[int], used: Iterable[int]) -> tuple:
    """`entry` if none of its axes is already used, else unsharded."""
    used = set(used)
    return tuple(entry) if not used.intersection(entry) else ()


def norm_dims(dims, ndim: int) -> List[int]:
    """Normalise an int / sequence / None of dims to a sorted list of non-negative dims."""
    if dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({int(d) % ndim for d in dims})


def shard_number(mesh, axes: Sequence[int], coords: Dict[int, int]) -> int:
    """Which of the pieces a dimension split over mesh `axes` (outermost first) this device's
    `coords` hold: 0 .. prod(axis sizes) - 1."""
    shard = 0
    for a in axes:
        shard = shard * mesh.device_matrix[a] + coords[a]
    return shard


def stacked_shard_numbers(mesh, axes: Sequence[int], batch) -> np.ndarray:
    """`shard_number` of every element of a batched call (`dtensor.batched.Batch`), shaped as
    its batch dimensions."""
    op_axes = list(batch.axes)
    shard = np.zeros(batch.sizes, np.int64)
    for a in axes:
        shape = [1] * batch.nb
        shape[op_axes.index(a)] = mesh.device_matrix[a]
        shard = shard * mesh.device_matrix[a] + np.arange(mesh.device_matrix[a]).reshape(shape)
    return shard
