"""A pipeline schedule as data: per rank, the ordered list of actions that rank executes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

from mindspore_hyper.schedule.actions import Action

__all__ = ["Schedule", "SEND_SEMANTICS", "chunk_table"]

SEND_SEMANTICS = ("buffered", "rendezvous")


@dataclass(frozen=True)
class Schedule:
    """Per rank an ordered list of actions, plus where each (virtual) stage lives.

    The model is cut into `num_stages * num_chunks` virtual stages (model order); rank r holds
    `num_chunks` of them. With one chunk per rank, stage s runs on rank s.

    Attributes:
        kind: the schedule family (one of SCHEDULE_KINDS, or a caller's own name for a
            hand-made schedule).
        num_stages: p, the number of pipeline ranks.
        num_microbatches: m, microbatches per step.
        num_chunks: v, model chunks (virtual stages) per rank.
        stage_to_rank: for each virtual stage in model order, the rank that runs it.
        actions: for each rank, its actions in execution order.
    """

    kind: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    stage_to_rank: Tuple[int, ...]
    actions: Tuple[Tuple[Action, ...], ...]

    def __post_init__(self):
        object.__setattr__(self, "stage_to_rank", tuple(self.stage_to_rank))
        object.__setattr__(self, "actions", tuple(tuple(rank_actions) for rank_actions in self.actions))

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    @property
    def num_virtual_stages(self) -> int:
        return len(self.stage_to_rank)

    def stages_of(self, rank: int) -> Tuple[int, ...]:
        """The virtual stages rank `rank` holds, in model order (index = chunk)."""
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)

    def chunk_of(self, stage: int) -> int:
        """Which chunk of its rank `stage` is (its position among the rank's stages)."""
        return chunk_table(self.stage_to_rank)[stage]


def chunk_table(stage_to_rank: Sequence[int]) -> Tuple[int, ...]:
    """For each stage, its chunk index on its rank (order among that rank's stages)."""
    seen = {}
    chunks = []
    for rank in stage_to_rank:
        chunks.append(seen.get(rank, 0))
        seen[rank] = chunks[-1] + 1
    return tuple(chunks)
