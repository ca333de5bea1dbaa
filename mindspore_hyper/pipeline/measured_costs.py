"""Simulating a schedule with the costs measured over several steps, per action.

A stage's compute time varies between microbatches and steps when processes share cores (one
action can take several times another's). `simulate_measured` prices each compute action
(kind, stage, microbatch) by its median duration over the given steps' measured timelines, and
each transfer by the median measured p2p latency: the simulated bubble is then what the
schedule predicts from typical per-action costs, comparable to the measured steps' bubble.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindspore_hyper.schedule.actions import Action, ActionKind
from mindspore_hyper.schedule.schedule import Schedule
from mindspore_hyper.schedule.simulation import simulate_schedule
from mindspore_hyper.schedule.schedule_timeline import ScheduleTimeline

__all__ = ["median_action_costs", "simulate_measured"]

ActionKey = Tuple[ActionKind, int, int]  # (kind, virtual stage, microbatch)


def median_action_costs(timelines: Sequence[ScheduleTimeline]) -> Dict[ActionKey, float]:
    """Median duration (seconds) of every compute action over `timelines`.

    Raises:
        ValueError: no timeline.
    """
    if not timelines:
        raise ValueError("median_action_costs: expected at least one measured timeline")
    durations: Dict[ActionKey, List[float]] = defaultdict(list)
    for timeline in timelines:
        for e in timeline.spans:
            if e.action.is_compute:
                durations[(e.action.kind, e.action.stage, e.action.microbatch)].append(e.duration)
    return {key: float(np.median(values)) for key, values in durations.items()}


def simulate_measured(schedule: Schedule, timelines: Sequence[ScheduleTimeline]) -> ScheduleTimeline:
    """The schedule simulated with per-action median costs and the median p2p latency of `timelines`."""
    from mindspore_hyper.pipeline.step_timelines import p2p_latency

    costs = median_action_costs(timelines)
    means: Dict[Tuple[ActionKind, int], List[float]] = defaultdict(list)
    for (kind, stage, _), value in costs.items():
        means[(kind, stage)].append(value)

    def action_cost(action: Action) -> Optional[float]:
        return costs.get((action.kind, action.stage, action.microbatch))

    latency = float(np.median([p2p_latency(t) for t in timelines]))
    return simulate_schedule(schedule, measured={k: float(np.mean(v)) for k, v in means.items()}, p2p=latency,
                    action_cost=action_cost)
