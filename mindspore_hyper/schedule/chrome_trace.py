"""Chrome trace-event JSON of a Timeline (any `TimelineView`; chrome://tracing, Perfetto): one thread per lane."""
from __future__ import annotations

import json
from typing import Dict, List

from mindspore_hyper.schedule.span import lane_name
from mindspore_hyper.schedule.timeline_view import TimelineView

__all__ = ["write_chrome_trace", "chrome_trace_events"]

_US_PER_SECOND = 1e6


def chrome_trace_events(timeline: TimelineView) -> List[Dict]:
    """Complete ("X") events in microseconds from the timeline's start (name: the span's label,
    cat: its kind, args: its args), one thread per lane named by `lane_name`, and the process
    named by the timeline's label when it has one."""
    events: List[Dict] = []
    if timeline.label:
        events.append({"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": timeline.label}})
    tids = {lane: i for i, lane in enumerate(timeline.lanes)}
    for lane, tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": lane_name(lane)}})
    for s in timeline.spans:
        events.append({"name": s.label, "cat": s.kind, "ph": "X", "pid": 0, "tid": tids[s.lane],
                       "ts": (s.start - timeline.start) * _US_PER_SECOND, "dur": s.duration * _US_PER_SECOND,
                       "args": dict(s.args)})
    return events


def write_chrome_trace(timeline: TimelineView, path: str) -> None:
    """Write {"traceEvents": [...], "displayTimeUnit": "ms"} to `path` (span times taken as seconds)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": chrome_trace_events(timeline), "displayTimeUnit": "ms"}, f)
