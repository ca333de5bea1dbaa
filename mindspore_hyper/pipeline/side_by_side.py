"""A measured pipeline timeline beside its simulation in one chrome trace (two processes)."""
from __future__ import annotations

import json
from typing import Sequence

from mindspore_hyper.schedule.chrome_trace import chrome_trace_events
from mindspore_hyper.schedule.timeline import Timeline

__all__ = ["write_side_by_side_trace"]


def write_side_by_side_trace(path: str, timelines: Sequence[Timeline]) -> None:
    """Write the timelines as trace processes 0, 1, ... (each from its own start, one thread per
    rank) in one trace-event JSON file for chrome://tracing or Perfetto.

    Raises:
        ValueError: no timeline.
    """
    if not timelines:
        raise ValueError("timelines: expected at least one Timeline")
    events = []
    for pid, timeline in enumerate(timelines):
        for event in chrome_trace_events(timeline):
            events.append(dict(event, pid=pid))
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
