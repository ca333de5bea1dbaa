"""Event-driven simulation of a schedule: when each action starts and ends, given its cost."""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional

from mindspore_hyper.schedule.actions import Action, ActionKind, P2PTensor
from mindspore_hyper.schedule.costs import ActionCosts, Cost, MeasuredCosts
from mindspore_hyper.schedule.schedule import Schedule
from mindspore_hyper.schedule.schedule_timeline import ScheduleTimeline
from mindspore_hyper.schedule.span import Span
from mindspore_hyper.schedule.validate import validate_schedule

__all__ = ["simulate_schedule"]


def simulate_schedule(schedule: Schedule, forward: Cost = 1.0, backward_input: Cost = 1.0, backward_weight: Cost = 1.0,
             p2p: float = 0.0, measured: Optional[MeasuredCosts] = None,
             action_cost: Optional[Callable[[Action], Optional[float]]] = None) -> ScheduleTimeline:
    """Time every action: it starts when its rank is free and its inputs have arrived.

    Each rank runs its list in order. A compute action takes its cost; a full backward costs
    backward_input + backward_weight. A send takes no rank time (buffered: the tensor is handed
    to the transport) and its tensor arrives `p2p` later; a receive lasts from when the rank
    reaches it until the tensor has arrived (that wait is idle time).

    Args:
        schedule: the schedule; it is validated first.
        forward, backward_input, backward_weight: cost of one action (one microbatch through one
            virtual stage), as one number or one per virtual stage.
        p2p: latency of one send -> receive, >= 0.
        measured: measured costs per (ActionKind, stage) instead of the three above (a mapping
            such as `ScheduleTimeline.mean_costs()` of a real run, or a callable returning None for a
            pair it cannot price).
        action_cost: optional cost of one compute action itself (e.g. measured per stage and
            microbatch); where it returns None the per-(kind, stage) cost applies.

    Returns:
        The ScheduleTimeline of all actions.

    Raises:
        ScheduleError: the schedule is invalid.
        ValueError: a bad cost or latency.
    """
    if isinstance(p2p, bool) or not isinstance(p2p, (int, float)) or not math.isfinite(p2p) or p2p < 0:
        raise ValueError(f"p2p={p2p!r}: expected a finite latency >= 0")
    validate_schedule(schedule)
    needed = {(a.kind, a.stage) for rank_actions in schedule.actions for a in rank_actions if a.is_compute}
    costs = ActionCosts.resolve(needed, schedule.num_virtual_stages, forward, backward_input, backward_weight,
                                measured)
    clock = [0.0] * schedule.num_ranks
    pc = [0] * schedule.num_ranks
    arrival: Dict[P2PTensor, float] = {}
    spans: List[Span] = []
    progress = True
    while progress:
        progress = False
        for rank, actions in enumerate(schedule.actions):
            while pc[rank] < len(actions):
                a = actions[pc[rank]]
                start = clock[rank]
                if a.kind is ActionKind.RECV:
                    if a.tensor not in arrival:
                        break
                    end = max(start, arrival[a.tensor])
                elif a.kind is ActionKind.SEND:
                    end = start
                    arrival[a.tensor] = end + p2p
                else:
                    cost = action_cost(a) if action_cost is not None else None
                    if cost is not None and not (math.isfinite(cost) and cost >= 0):
                        raise ValueError(f"action_cost({a}) = {cost!r}: expected a finite cost >= 0")
                    end = start + (costs(a.kind, a.stage) if cost is None else cost)
                spans.append(Span.for_action(rank, a, start, end))
                clock[rank] = end
                pc[rank] += 1
                progress = True
    return ScheduleTimeline(spans, num_ranks=schedule.num_ranks, label=_label(schedule))


def _label(schedule: Schedule) -> str:
    chunks = f", v={schedule.num_chunks}" if schedule.num_chunks > 1 else ""
    return f"{schedule.kind} p={schedule.num_stages}, m={schedule.num_microbatches}{chunks}"
