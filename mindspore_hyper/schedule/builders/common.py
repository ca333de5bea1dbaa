"""Turn per-rank compute orders into a Schedule by adding the sends and receives they need."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

from mindspore_hyper.schedule.actions import Action, ActionKind, Payload
from mindspore_hyper.schedule.schedule import Schedule, chunk_table

__all__ = ["ComputeStep", "Overlapped", "assemble"]

ComputeStep = Tuple[ActionKind, int, int]  # (kind, stage, microbatch)


@dataclass(frozen=True)
class Overlapped:
    """Compute steps that start together once all their inputs arrived, then run in the listed order.

    DualPipe overlaps one microbatch's forward with another's backward to hide communication:
    both receives come first, then the two computes (each followed by its send).
    """

    steps: Tuple[ComputeStep, ...]


def assemble(kind: str, num_microbatches: int, stage_to_rank: Sequence[int],
             compute_orders: Sequence[Sequence[Union[ComputeStep, Overlapped]]]) -> Schedule:
    """Build a Schedule from each rank's compute order.

    A receive goes right before the compute that needs it (before the whole group for an
    Overlapped group) and a send right after the compute that produced it, for every
    neighbouring pair of stages on different ranks.

    Args:
        kind: the schedule family name.
        num_microbatches: m.
        stage_to_rank: rank of each virtual stage, in model order.
        compute_orders: per rank, its compute steps (kind, stage, microbatch) or Overlapped
            groups of them, in order.

    Returns:
        The Schedule (not yet validated).
    """
    chunks = chunk_table(stage_to_rank)
    last = len(stage_to_rank) - 1
    rank_lists: List[List[Action]] = []
    for rank, order in enumerate(compute_orders):
        actions: List[Action] = []
        for item in order:
            group = item.steps if isinstance(item, Overlapped) else (item,)
            for step_kind, stage, mb in group:
                before = _exchanges(step_kind, stage, last)[0]
                if before is not None and stage_to_rank[before[1]] != rank:
                    actions.append(Action(ActionKind.RECV, stage, chunks[stage], mb, stage_to_rank[before[1]],
                                          before[0]))
            for step_kind, stage, mb in group:
                actions.append(Action(step_kind, stage, chunks[stage], mb))
                after = _exchanges(step_kind, stage, last)[1]
                if after is not None and stage_to_rank[after[1]] != rank:
                    actions.append(Action(ActionKind.SEND, stage, chunks[stage], mb, stage_to_rank[after[1]],
                                          after[0]))
        rank_lists.append(actions)
    num_ranks = len(compute_orders)
    return Schedule(kind=kind, num_stages=num_ranks, num_microbatches=num_microbatches,
                    num_chunks=len(stage_to_rank) // num_ranks, stage_to_rank=tuple(stage_to_rank),
                    actions=tuple(tuple(a) for a in rank_lists))


def _exchanges(kind: ActionKind, stage: int, last: int) -> Tuple[Optional[Tuple[Payload, int]],
                                                               Optional[Tuple[Payload, int]]]:
    """What a compute action receives before it and sends after it, as (payload, neighbour stage)."""
    if kind is ActionKind.FORWARD:
        return ((Payload.ACTIVATION, stage - 1) if stage > 0 else None,
                (Payload.ACTIVATION, stage + 1) if stage < last else None)
    if kind in (ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT):
        return ((Payload.GRADIENT, stage + 1) if stage < last else None,
                (Payload.GRADIENT, stage - 1) if stage > 0 else None)
    return None, None
