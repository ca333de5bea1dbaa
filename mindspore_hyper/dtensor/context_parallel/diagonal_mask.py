"""DiagonalMask: an attention mask whose value at (row, col) depends only on the side of one
diagonal the position lies on, so the blocks ring attention skips follow from positions alone.

A causal mask is one: `np.triu(np.full((t, s), -1e9), 1)` (additive), `np.tril(ones(bool))` as
a kept-positions mask and its negation as a fill mask. A mask is diagonal when its last two
dimensions hold `above` where col - row > `offset` and `below` elsewhere, the same for every
leading index. The dry run (whose shards have no values) recognises such a mask once from the
host constant the model code built it from (`MetaTensor.constant`): recognising reads the
constant, O(t * s), and the result is kept while the constant lives.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

__all__ = ["DiagonalMask", "recognise", "diagonal_of"]


@dataclass(frozen=True)
class DiagonalMask:
    """A mask holding `above` where col - row > `offset`, `below` elsewhere (see module docstring).

    Attributes:
        offset: the diagonal (0: the main diagonal and below hold `below`).
        above: the value above it, a (1, 1) array of the mask's dtype.
        below: the value on and below it, a (1, 1) array of the mask's dtype.
    """

    offset: int
    above: np.ndarray
    below: np.ndarray

    def at(self, distances: np.ndarray) -> np.ndarray:
        """The mask's values at positions with col - row = `distances` (an int array), of the
        mask's dtype and the shape of `distances` (at least 2-d, as a block of the mask is)."""
        return np.where(distances > self.offset, self.above, self.below)


def recognise(array: np.ndarray) -> Optional[DiagonalMask]:
    """`array` as a DiagonalMask, or None when it is not one (fewer than two dimensions,
    leading slices that differ, values not split by one diagonal, NaN)."""
    if array.ndim < 2 or 0 in array.shape:
        return None
    t, s = array.shape[-2:]
    planes = array.reshape((-1, t, s))
    first = planes[0]
    if not np.array_equal(planes, np.broadcast_to(first, planes.shape)):
        return None
    below, above = first[t - 1:, :1], first[:1, s - 1:]  # the smallest and the largest col - row
    if np.array_equal(below, above):
        offset = s - 1  # no position lies above it
    else:
        counts = (first == below).sum(axis=1)  # row r holds `below` in columns 0 .. r + offset
        mixed = np.nonzero((counts > 0) & (counts < s))[0]
        whole = np.nonzero(counts == s)[0]
        if mixed.size:
            offset = int(counts[mixed[0]]) - int(mixed[0]) - 1
        elif whole.size:
            offset = -int(whole[0])  # one column: the first row holding `below`
        else:
            return None
    expected = np.where(np.arange(s)[None, :] > np.arange(t)[:, None] + offset, above, below)
    if not np.array_equal(first, expected):
        return None
    return DiagonalMask(offset, above.copy(), below.copy())


# id(constant) -> (a weak reference to it, its recognition): one reading per constant
_SEEN: Dict[int, Tuple[weakref.ref, Optional[DiagonalMask]]] = {}


def diagonal_of(constant) -> Optional[DiagonalMask]:
    """The DiagonalMask a host constant (a plain `mindspore.Tensor` with values) is, or None;
    recognised once per constant object.

    Args:
        constant: the constant, or None (no constant: None).

    Returns:
        Its DiagonalMask, or None.
    """
    if constant is None:
        return None
    key = id(constant)
    seen = _SEEN.get(key)
    if seen is not None and seen[0]() is constant:
        return seen[1]
    found = recognise(constant.asnumpy())
    _SEEN[key] = (weakref.ref(constant, lambda _, k=key: _SEEN.pop(k, None)), found)
    return found
