"""Which bytes of which files a process needs: the box of its target layout (the layout algebra's
`TensorLayout.rank_slices`), the stored shards that box overlaps, and inside each shard the
contiguous byte runs of the overlap (C order), so nothing outside the target region is read."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import List, Sequence, Tuple

from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.manifest import ShardEntry, TensorEntry
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["rank_box", "Piece", "pieces_of", "byte_runs"]


def rank_box(layout: TensorLayout, rank: int, global_shape: Sequence[int]) -> Box:
    """The region of a tensor of `global_shape` that `rank` holds under `layout`."""
    return Box.from_slices(layout.rank_slices(rank, global_shape))


@dataclass(frozen=True)
class Piece:
    """The part (global coordinates) of one stored shard that a target region needs."""

    shard: ShardEntry
    part: Box

    @property
    def in_shard(self) -> Box:
        """The part in the shard's own coordinates."""
        start = tuple(a - s for a, s in zip(self.part.start, self.shard.box.start))
        return Box(start, tuple(a + n for a, n in zip(start, self.part.shape)))


def pieces_of(entry: TensorEntry, target: Box) -> List[Piece]:
    """The stored shards of `entry` that `target` overlaps, with the overlaps (they tile `target`).

    Raises:
        CheckpointError: the shards leave part of `target` uncovered.
    """
    out = []
    for shard in entry.shards:
        part = shard.box.intersect(target)
        if part is not None:
            out.append(Piece(shard, part))
    if sum(p.part.volume for p in out) != target.volume:
        raise CheckpointError(f"{entry.name}: the stored shards do not cover the region {target}")
    return out


def byte_runs(shape: Sequence[int], itemsize: int, part: Box) -> List[Tuple[int, int]]:
    """(offset, length) byte runs, relative to the first byte of a C-ordered array of `shape`,
    that hold `part` (in that array's coordinates), in C order of `part`; adjacent rows merge
    into one run when `part` spans whole trailing dimensions."""
    ndim = len(shape)
    inner = ndim  # dimensions inner..ndim-1 are covered whole by `part`
    while inner > 0 and part.start[inner - 1] == 0 and part.stop[inner - 1] == shape[inner - 1]:
        inner -= 1
    if inner == 0:
        return [(0, math.prod(shape) * itemsize)]
    strides = [math.prod(shape[d + 1:]) for d in range(ndim)]
    split = inner - 1  # the innermost dimension cut by `part`: one run per index of the outer ones
    length = (part.stop[split] - part.start[split]) * strides[split] * itemsize
    base = part.start[split] * strides[split]
    outer = [range(part.start[d], part.stop[d]) for d in range(split)]
    return [((base + sum(i * strides[d] for d, i in enumerate(index))) * itemsize, length)
            for index in itertools.product(*outer)]
