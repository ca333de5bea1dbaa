"""Simulating a schedule whose ranks share compute: a rank's speed depends on how many ranks compute at once.

When a pipeline runs more processes than the host has cores (4 ranks on 2 CPU cores), the OS
shares the cores among the ranks that compute at that moment. During the warm-up and the
cool-down, and whenever a rank waits in a receive, the ranks that do compute get a larger share
and run faster than while every rank computes. `simulate_shared` times the actions as
`simulate_schedule` does (a rank runs its list in order; a send takes no rank time and its tensor
arrives `p2p` later; a receive lasts until its tensor has arrived), except that a compute action
holds `cost` units of work and progresses at `speeds[k - 1]` units per second while k ranks
compute (processor sharing), or, where the ranks are bound to cores and only those on one core
share it, at `speeds(rank, computing)` units per second (a function of the set of computing
ranks). With every speed 1 it gives `simulate_schedule`'s times.

The simulation is event driven: between two events (a compute action ends, a tensor a waiting
rank needs arrives) the set of computing ranks, hence their speed, is constant.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Union

from mindspore_hyper.schedule.actions import ActionKind, P2PTensor
from mindspore_hyper.schedule.costs import ActionCosts, Cost
from mindspore_hyper.schedule.schedule import Schedule
from mindspore_hyper.schedule.schedule_timeline import ScheduleTimeline
from mindspore_hyper.schedule.span import Span
from mindspore_hyper.schedule.validate import validate_schedule

__all__ = ["simulate_shared"]

Speeds = Union[Sequence[float], Callable[[int, FrozenSet[int]], float]]

_FINISH_TOLERANCE = 1e-12  # relative: work left below this fraction of the step's progress counts as done


def _is_speed(value) -> bool:
    """A speed is a finite number > 0 (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _check_speeds(speeds: Speeds, num_ranks: int) -> Callable[[int, FrozenSet[int]], float]:
    """The speed of a rank given the computing ranks, from either form (checked)."""
    if callable(speeds):
        def checked(rank: int, computing: FrozenSet[int]) -> float:
            s = speeds(rank, computing)
            if not _is_speed(s):
                raise ValueError(f"speeds({rank}, {sorted(computing)})={s!r}: expected a finite number > 0")
            return float(s)
        return checked
    if isinstance(speeds, (str, bytes)) or not isinstance(speeds, Sequence) or len(speeds) != num_ranks:
        raise ValueError(f"speeds={speeds!r}: expected one speed per number of computing ranks (1..{num_ranks})")
    for k, s in enumerate(speeds, 1):
        if not _is_speed(s):
            raise ValueError(f"speeds[{k - 1}]={s!r} (the speed with {k} ranks computing): expected a finite "
                             f"number > 0")
    by_count = tuple(float(s) for s in speeds)
    return lambda rank, computing: by_count[len(computing) - 1]


def simulate_shared(schedule: Schedule, forward: Cost = 1.0, backward_input: Cost = 1.0,
                    backward_weight: Cost = 1.0, p2p: float = 0.0,
                    speeds: Optional[Speeds] = None) -> ScheduleTimeline:
    """Time every action when the computing ranks share their speed (module doc).

    Args:
        schedule: the schedule; it is validated first.
        forward, backward_input, backward_weight: work of one action (one microbatch through one
            virtual stage) in units that a rank does at speed 1 in one second, as one number or
            one per virtual stage; a full backward is backward_input + backward_weight.
        p2p: seconds from a send to its tensor's arrival, >= 0 (takes no compute).
        speeds: speeds[k - 1] = work units per second of each computing rank while k ranks
            compute, one entry per k = 1 .. num_ranks; or a function (rank, the set of computing
            ranks) -> that rank's work units per second; None: 1 always.

    Returns:
        The ScheduleTimeline of all actions.

    Raises:
        ScheduleError: the schedule is invalid.
        ValueError: a bad cost, latency or speed (named).
    """
    if isinstance(p2p, bool) or not isinstance(p2p, (int, float)) or not math.isfinite(p2p) or p2p < 0:
        raise ValueError(f"p2p={p2p!r}: expected a finite latency >= 0")
    validate_schedule(schedule)
    ranks = schedule.num_ranks
    rate = _check_speeds((1.0,) * ranks if speeds is None else speeds, ranks)
    needed = {(a.kind, a.stage) for rank_actions in schedule.actions for a in rank_actions if a.is_compute}
    costs = ActionCosts.resolve(needed, schedule.num_virtual_stages, forward, backward_input, backward_weight)
    pc = [0] * ranks
    started: List[Optional[float]] = [None] * ranks  # when the rank reached its current action
    left: List[Optional[float]] = [None] * ranks  # work left of the rank's running compute action
    arrival: Dict[P2PTensor, float] = {}
    spans: List[Span] = []
    now = 0.0

    def advance(rank: int) -> bool:
        """Run the rank's sends and arrived receives at `now`, up to its next compute or wait."""
        moved = False
        actions = schedule.actions[rank]
        while left[rank] is None and pc[rank] < len(actions):
            a = actions[pc[rank]]
            if started[rank] is None:
                started[rank] = now
            if a.kind is ActionKind.RECV:
                if arrival.get(a.tensor, math.inf) > now:
                    return moved
            elif a.kind is ActionKind.SEND:
                arrival[a.tensor] = now + p2p
            else:
                left[rank] = costs(a.kind, a.stage)
                return True
            spans.append(Span.for_action(rank, a, started[rank], now))
            started[rank], pc[rank], moved = None, pc[rank] + 1, True
        return moved

    while True:
        while any([advance(r) for r in range(ranks)]):  # a send may release a receive of an earlier rank
            pass
        computing = [r for r in range(ranks) if left[r] is not None]
        waiting = [arrival[schedule.actions[r][pc[r]].tensor] for r in range(ranks)
                   if left[r] is None and pc[r] < len(schedule.actions[r])
                   and schedule.actions[r][pc[r]].tensor in arrival]
        if not computing and not waiting:
            break  # every rank is done (a validated schedule cannot stall)
        busy = frozenset(computing)
        speed = {r: rate(r, busy) for r in computing}
        step = min([left[r] / speed[r] for r in computing] + [t - now for t in waiting])
        for r in computing:
            left[r] -= speed[r] * step
            if left[r] <= _FINISH_TOLERANCE * max(speed[r] * step, 1.0):
                spans.append(Span.for_action(r, schedule.actions[r][pc[r]], started[r], now + step))
                started[r], left[r], pc[r] = None, None, pc[r] + 1
        now += step
    chunks = f", v={schedule.num_chunks}" if schedule.num_chunks > 1 else ""
    return ScheduleTimeline(spans, num_ranks=ranks,
                            label=f"{schedule.kind} p={schedule.num_stages}, m={schedule.num_microbatches}{chunks}, "
                                  f"shared speeds")
