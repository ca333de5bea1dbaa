"""Turn per-rank compute orders into a Schedule by adding the sends and receives they need."""
from __future__ import annotations

from typing import List, Sequence, Tuple

from mindspore_hyper.schedule.actions import Action, ActionKind, Payload
from mindspore_hyper.schedule.schedule import Schedule, chunk_table

__all__ = ["ComputeStep", "assemble"]

ComputeStep = Tuple[ActionKind, int, int]  # (kind, stage, microbatch)


def assemble(kind: str, num_microbatches: int, stage_to_rank: Sequence[int],
             compute_orders: Sequence[Sequence[ComputeStep]]) -> Schedule:
    """Build a Schedule from each rank's compute order.

    A receive goes right before the compute that needs it and a send right after the compute
    that produced it, for every neighbouring pair of stages on different ranks.

    Args:
        kind: the schedule family name.
        num_microbatches: m.
        stage_to_rank: rank of each virtual stage, in model order.
        compute_orders: per rank, (kind, stage, microbatch) of its compute actions in order.

    Returns:
        The Schedule (not yet validated).
    """
    chunks = chunk_table(stage_to_rank)
    last = len(stage_to_rank) - 1
    rank_lists: List[List[Action]] = []
    for rank, order in enumerate(compute_orders):
        actions: List[Action] = []
        for step_kind, stage, mb in order:
            chunk = chunks[stage]

            def p2p(p2p_kind: ActionKind, payload: Payload, other: int) -> None:
                if stage_to_rank[other] != rank:
                    actions.append(Action(p2p_kind, stage, chunk, mb, stage_to_rank[other], payload))

            if step_kind is ActionKind.FORWARD and stage > 0:
                p2p(ActionKind.RECV, Payload.ACTIVATION, stage - 1)
            elif step_kind in (ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT) and stage < last:
                p2p(ActionKind.RECV, Payload.GRADIENT, stage + 1)
            actions.append(Action(step_kind, stage, chunk, mb))
            if step_kind is ActionKind.FORWARD and stage < last:
                p2p(ActionKind.SEND, Payload.ACTIVATION, stage + 1)
            elif step_kind in (ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT) and stage > 0:
                p2p(ActionKind.SEND, Payload.GRADIENT, stage - 1)
        rank_lists.append(actions)
    num_ranks = len(compute_orders)
    return Schedule(kind=kind, num_stages=num_ranks, num_microbatches=num_microbatches,
                    num_chunks=len(stage_to_rank) // num_ranks, stage_to_rank=tuple(stage_to_rank),
                    actions=tuple(tuple(a) for a in rank_lists))
