"""How ring attention's tensors move between the members of a ring (`ring_core.RingAttention`):
`LocalRing` when this process holds every member (simulation), `ProcessRing` when it holds one
(msrun). Both record what a device sends as "P2P" on the cp axis, forward or backward.

A transport has two moves, given per local member (member order):

- `shift(tensors, phase)`: member r's tensors go to member r+1 (mod n); returns a handle whose
  `wait()` gives, per member, member r-1's.
- `permute(chunks, sources, phase)`: member i holds chunks i*p .. i*p+p-1 of a global order and
  gets chunks sources[i*p] .. sources[i*p+p-1] (the zigzag order and back).
"""
from __future__ import annotations

import math
from typing import Callable, List, Sequence

from mindspore import Tensor

__all__ = ["LocalRing", "ProcessRing"]

Record = Callable[[int, bool], None]  # (bytes one device sends, backward?)


def _nbytes(tensors: Sequence[Tensor]) -> int:
    return sum(math.prod(t.shape) * t.dtype.itemsize for t in tensors)


class _Arrived:
    """A shift already done (every member in this process): `wait()` gives its result."""

    def __init__(self, result: List[List[Tensor]]):
        self._result = result

    def wait(self) -> List[List[Tensor]]:
        return self._result


class LocalRing:
    """All n members in this process, member index = cp rank: a shift hands member r-1's tensors to
    member r, a permute reorders chunks; nothing is copied.

    Args:
        record: called with the bytes one device sends per move (the busiest device) and whether
            it is the backward's.
        rings: rings stacked in each member's tensors (one per coordinate off the cp axis): a
            device's bytes are the member's over `rings`.
    """

    def __init__(self, record: Record, rings: int = 1):
        self._record, self._rings = record, rings

    def shift(self, tensors: List[List[Tensor]], phase: str) -> _Arrived:
        n = len(tensors)
        self._record(max(_nbytes(t) for t in tensors) // self._rings, phase == "backward")
        return _Arrived([tensors[(r - 1) % n] for r in range(n)])

    def permute(self, chunks: List[List[Tensor]], sources: Sequence[int], phase: str) -> List[List[Tensor]]:
        p = len(chunks[0])
        flat = [c for member in chunks for c in member]
        leaving = [0] * len(chunks)  # bytes each member sends
        for k, c in enumerate(sources):
            if c // p != k // p:
                leaving[c // p] += _nbytes([flat[c]])
        self._record(max(leaving) // self._rings, phase == "backward")
        moved = [flat[c] for c in sources]
        return [moved[i * p:(i + 1) * p] for i in range(len(chunks))]


class _OneMember:
    """`ring_shift_async`'s handle as a transport handle (a list of one member's tensors)."""

    def __init__(self, handle):
        self._handle = handle

    def wait(self) -> List[List[Tensor]]:
        return [self._handle.wait()]


class ProcessRing:
    """One member in this process (msrun): shifts by the collectives' `ring_shift_async` (posted
    to the group's sender thread, so the caller computes while the bytes move), permutes by their
    `permute_chunks`.

    Args:
        collectives: the process collectives (`ring_shift_async`, `permute_chunks`).
        group: the cp ring through this process's rank.
        record: called with the bytes this process sends per move and whether it is the
            backward's (only when `group.records`).
    """

    def __init__(self, collectives, group, record: Record):
        self._collectives, self._group, self._record = collectives, group, record

    def shift(self, tensors: List[List[Tensor]], phase: str) -> _OneMember:
        (mine,) = tensors
        if self._group.records:
            self._record(_nbytes(mine), phase == "backward")
        return _OneMember(self._collectives.ring_shift_async(mine, self._group, phase=phase))

    def permute(self, chunks: List[List[Tensor]], sources: Sequence[int], phase: str) -> List[List[Tensor]]:
        (mine,) = chunks
        p, me = len(mine), self._group.local[0]
        if self._group.records:
            leaving = [mine[c % p] for k, c in enumerate(sources) if c // p == me and k // p != me]
            self._record(_nbytes(leaving), phase == "backward")
        return [self._collectives.permute_chunks(mine, sources, self._group)]
