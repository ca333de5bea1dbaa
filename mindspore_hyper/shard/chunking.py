"""torch.chunk arithmetic: where each piece of a dimension split into uneven pieces lies.

HyperParallel and torch.distributed.tensor split a dimension of `size` elements over `pieces`
devices as `torch.chunk` does: every piece has ceil(size / pieces) elements except the trailing
ones, which have fewer or none (7 over 4: 2, 2, 2, 1; 3 over 4: 1, 1, 1, 0). A dimension split
over several mesh axes is chunked axis by axis, major first (torch's order over mesh dimensions).
When `size` divides evenly this is the even contiguous split.
"""
from __future__ import annotations

from typing import Sequence, Tuple

__all__ = ["chunk_bounds", "nested_chunk_bounds", "chunk_sizes"]


def chunk_bounds(size: int, pieces: int, index: int) -> Tuple[int, int]:
    """(start, length) in elements of piece `index` of `size` elements chunked into `pieces`."""
    step = -(-size // pieces)
    start = min(index * step, size)
    return start, min(step, size - start)


def chunk_sizes(size: int, pieces: int) -> Tuple[int, ...]:
    """The lengths of all `pieces` pieces of `size` elements, in order."""
    return tuple(chunk_bounds(size, pieces, i)[1] for i in range(pieces))


def nested_chunk_bounds(size: int, pieces: Sequence[int], indices: Sequence[int]) -> Tuple[int, int]:
    """(start, length) of the piece at `indices` of a dimension chunked by `pieces[0]`, each of
    those by `pieces[1]`, and so on (one entry per mesh axis, major first)."""
    start, length = 0, size
    for n, i in zip(pieces, indices):
        offset, length = chunk_bounds(length, n, i)
        start += offset
    return start, length
