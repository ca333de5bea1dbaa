"""Padded local storage: a Parameter standing for an empty piece of this process.

Under msrun each process's Parameter is its piece of the global one, as it is. torch.chunk pieces
(a dimension the devices do not divide: `fully_shard`'s split, as FSDP2's and upstream's) leave the
trailing devices fewer rows or none, and MindSpore's optimizers cannot hold a Parameter of 0
elements (`nn.Adam`, `nn.SGD`, `mint.optim.AdamW` over a (0, 8) Parameter stop in `initializer`).
So a process whose piece of dimension 0 is empty (5 rows over 4 devices: 2, 2, 1, 0) stores one
zero row in its place; every other process stores its real rows only. The DTensor's shard is the
real rows (`stored_piece`: empty there); the padding takes no part in any op, so its gradient is
zero, and an optimizer whose update of a zero weight with a zero gradient is zero (by their update
rules SGD, Adam, AdamW: their states stay zero) keeps it zero. Writes into the Parameter pad the
new piece again (`padded`). A checkpoint holds the real rows only: the writer cuts them off the
stored array and a load pads them again (`is_padded`, `padded_array`).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
from mindspore import Tensor, ops

__all__ = ["stored_piece", "padded", "is_padded", "padded_array"]


def is_padded(stored_shape: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether a Parameter of `stored_shape` stores a piece of `shape` padded: more rows (dimension
    0), the other dimensions equal."""
    return (len(stored_shape) > 0 and len(stored_shape) == len(shape)
            and tuple(stored_shape[1:]) == tuple(shape[1:]) and stored_shape[0] > shape[0])


def stored_piece(param: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """The piece of `shape` that `param` stores: its first shape[0] rows where it holds more rows
    than that (padded; a split, not a slice: MindSpore's CPU StridedSliceGrad fails on an empty
    slice, and a split's backward, a concat, gives the padding a zero gradient), else `param`."""
    if not is_padded(param.shape, shape):
        return param  # stored as it is (not padded)
    held = param.shape[0]
    if shape[0] == 0:
        return ops.split(param, [held, 0], 0)[1]
    return ops.split(param, [shape[0], held - shape[0]], 0)[0]


def padded(value: Tensor, rows: int) -> Tensor:
    """`value` with zero rows appended up to `rows` (as it is when it has that many)."""
    have = value.shape[0]
    if have == rows:
        return value
    return ops.concat([value, ops.zeros((rows - have,) + tuple(value.shape[1:]), value.dtype)], 0)


def padded_array(value: np.ndarray, rows: int) -> np.ndarray:
    """`value` (a piece read from a checkpoint) with zero rows appended up to `rows`, as the
    Parameter stores it (`value` itself when it has that many)."""
    if value.shape[0] == rows:
        return value
    out = np.zeros((rows,) + value.shape[1:], value.dtype)
    out[:value.shape[0]] = value
    return out
