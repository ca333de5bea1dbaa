"""Box: a rectangular region of a global tensor, [start, stop) per dimension, in global indices."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

__all__ = ["Box"]


@dataclass(frozen=True)
class Box:
    """Region [start[d], stop[d]) along every dimension d of a global tensor (a 0-d tensor's box is ())."""

    start: Tuple[int, ...]
    stop: Tuple[int, ...]

    @classmethod
    def full(cls, shape: Sequence[int]) -> "Box":
        """The whole tensor of `shape`."""
        return cls(tuple(0 for _ in shape), tuple(int(n) for n in shape))

    @classmethod
    def from_slices(cls, slices: Sequence[slice]) -> "Box":
        """From the slices `TensorLayout.rank_slices` returns (explicit start and stop)."""
        return cls(tuple(s.start for s in slices), tuple(s.stop for s in slices))

    @classmethod
    def from_pairs(cls, pairs: Sequence[Sequence[int]]) -> "Box":
        """From [[start, stop], ...], the manifest's form."""
        return cls(tuple(int(p[0]) for p in pairs), tuple(int(p[1]) for p in pairs))

    def to_pairs(self) -> List[List[int]]:
        return [[a, b] for a, b in zip(self.start, self.stop)]

    @property
    def ndim(self) -> int:
        return len(self.start)

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.start, self.stop))

    @property
    def volume(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def intersect(self, other: "Box") -> Optional["Box"]:
        """The common region, or None when they do not overlap."""
        start = tuple(max(a, b) for a, b in zip(self.start, other.start))
        stop = tuple(min(a, b) for a, b in zip(self.stop, other.stop))
        if any(a >= b for a, b in zip(start, stop)):
            return None
        return Box(start, stop)

    def contains(self, other: "Box") -> bool:
        return all(a <= c and d <= b for a, b, c, d in zip(self.start, self.stop, other.start, other.stop))

    def within(self, outer: "Box") -> Tuple[slice, ...]:
        """This box as slices of an array holding `outer`."""
        return tuple(slice(a - o, b - o) for a, b, o in zip(self.start, self.stop, outer.start))

    def fits(self, shape: Sequence[int]) -> bool:
        """Non-empty and inside a tensor of `shape`."""
        return (len(shape) == self.ndim
                and all(0 <= a < b <= n for a, b, n in zip(self.start, self.stop, shape)))

    def __repr__(self) -> str:
        return "Box[" + ", ".join(f"{a}:{b}" for a, b in zip(self.start, self.stop)) + "]"
