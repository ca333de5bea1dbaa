"""Some of the job's processes seen as a world of their own: a pipeline stage's processes, an
MPMD device group.

A sub-mesh numbers its devices 0..n-1 (a Layout's ranks are always a permutation of range(n));
a `SubWorld` maps those ranks to the global ranks of the processes that run them, so a
`DistributedRuntime` over it (and the `DistributedModel` it builds) talks to exactly those
processes. `World.sub(ranks)` makes one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

__all__ = ["SubWorld"]


@dataclass(frozen=True)
class SubWorld:
    """The processes of global `ranks`, renumbered by position (sub-world rank i = global rank ranks[i]).

    Attributes:
        world: the job's World.
        ranks: the global rank of each sub-world rank.
    """

    world: object
    ranks: Tuple[int, ...]

    @property
    def rank(self) -> int:
        """This process's sub-world rank (it must be one of `ranks`)."""
        return self.ranks.index(self.world.rank)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def timeout(self) -> float:
        return self.world.timeout

    def communicator(self, ranks: Tuple[int, ...]):
        """The job's communicator of the processes at these sub-world ranks."""
        return self.world.communicator(tuple(self.ranks[int(r)] for r in ranks))
