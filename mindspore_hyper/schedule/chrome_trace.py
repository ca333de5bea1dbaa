"""Chrome trace-event JSON of a Timeline (chrome://tracing, Perfetto): one thread per rank."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Dict, List

if TYPE_CHECKING:
    from mindspore_hyper.schedule.timeline import Timeline

__all__ = ["write_chrome_trace", "chrome_trace_events"]

_US_PER_SECOND = 1e6


def chrome_trace_events(timeline: "Timeline") -> List[Dict]:
    """Complete ("X") events in microseconds from the timeline's start, plus rank thread names."""
    events: List[Dict] = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
                           "args": {"name": timeline.label or "pipeline"}}]
    for rank in range(timeline.num_ranks):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank, "args": {"name": f"rank {rank}"}})
    for e in timeline.events:
        a = e.action
        args = {"stage": a.stage, "chunk": a.chunk, "microbatch": a.microbatch}
        if a.peer is not None:
            args.update(peer=a.peer, payload=a.payload.value)
        events.append({"name": str(a), "cat": a.kind.value, "ph": "X", "pid": 0, "tid": e.rank,
                       "ts": (e.start - timeline.start) * _US_PER_SECOND, "dur": e.duration * _US_PER_SECOND,
                       "args": args})
    return events


def write_chrome_trace(timeline: "Timeline", path: str) -> None:
    """Write {"traceEvents": [...], "displayTimeUnit": "ms"} to `path` (times taken as seconds)."""
    with open(path, "w") as f:
        json.dump({"traceEvents": chrome_trace_events(timeline), "displayTimeUnit": "ms"}, f)
