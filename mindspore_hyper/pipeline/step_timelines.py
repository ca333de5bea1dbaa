"""A PipelineModel's step as timelines: the measured start/end of every action, and the schedule
simulated with the measured costs."""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from mindspore_hyper.schedule.actions import ActionKind
from mindspore_hyper.schedule.schedule_timeline import ScheduleTimeline
from mindspore_hyper.schedule.simulation import simulate_schedule

__all__ = ["stage_times", "measured_timeline", "simulated_timeline", "p2p_latency"]


def stage_times(model) -> Tuple[float, ...]:
    """Seconds of compute per virtual stage in the last step (this process's stages; 0 for others)."""
    times = [0.0] * len(model.split)
    for _, action, start, end in model.last_events:
        if action.is_compute:
            times[action.stage] += end - start
    return tuple(times)


def measured_timeline(model) -> ScheduleTimeline:
    """See PipelineModel.measured_timeline."""
    records = list(model.last_events)
    if not model.in_one_process and model.world.size > 1:
        records = _gather_records(model)
    model.last_measured = ScheduleTimeline.from_records(records, num_ranks=model.schedule.num_ranks,
                                                        label=f"{model.schedule.kind} measured")
    model.measured_step = model.steps_run
    return model.last_measured


def _gather_records(model) -> List[tuple]:
    """Every pipeline rank's (rank, action, start, end), each as its first process ran it."""
    schedule = model.schedule
    longest = max(len(a) for a in schedule.actions)
    table = np.full((longest, 2), np.nan)
    for index, (_, _, start, end) in enumerate(model.last_events):
        table[index] = (start, end)
    gathered = model.runtime.gather_values(table)
    records = []
    for rank in range(schedule.num_ranks):
        rows = gathered[model.process_of(rank)]
        for index, action in enumerate(schedule.actions[rank]):
            records.append((rank, action, rows[index, 0], rows[index, 1]))
    return records


def simulated_timeline(model, measured: Optional[ScheduleTimeline] = None) -> ScheduleTimeline:
    """See PipelineModel.simulated_timeline."""
    if measured is None:
        if not model.in_one_process and model.measured_step != model.steps_run:
            raise ValueError("simulated_timeline(): under msrun, call measured_timeline() on every process "
                             "after the step first (each process holds only its own actions' times)")
        measured = model.last_measured if not model.in_one_process else \
            ScheduleTimeline.from_records(model.last_events, num_ranks=model.schedule.num_ranks)
    return simulate_schedule(model.schedule, measured=measured.mean_costs(), p2p=p2p_latency(measured))


def p2p_latency(timeline: ScheduleTimeline) -> float:
    """Median seconds from a send's start to its receive's end, over the transfers whose receiver
    was already waiting (so the time is the transfer's, not the receiver's lateness); 0 if none.
    In simulation all ranks share one process and transfers are dictionary puts (about 0)."""
    sends = {(e.action.tensor, e.lane): e for e in timeline.spans if e.action.kind is ActionKind.SEND}
    latencies = []
    for e in timeline.spans:
        if e.action.kind is ActionKind.RECV:
            send = sends.get((e.action.tensor, e.action.peer))
            if send is not None and e.start <= send.start:
                latencies.append(e.end - send.start)
    return float(np.median(latencies)) if latencies else 0.0
