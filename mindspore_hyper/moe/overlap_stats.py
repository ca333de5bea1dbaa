"""The overlap ratio of chunked expert exchanges, from real timestamps.

The background thread records each exchange's (start, end) and the layer records each wait
for one; communication is *exposed* while the layer waits for an exchange that is running, and
*hidden* otherwise. overlap ratio = hidden / total communication time (seconds of
`time.perf_counter`). Waiting for an exchange that has not started yet (the thread busy with an
earlier one) counts as neither: it is queueing, reported separately.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

__all__ = ["Interval", "merge", "overlap_report"]

Interval = Tuple[float, float]


def merge(intervals: Sequence[Interval]) -> List[Interval]:
    """The union of `intervals` as sorted disjoint intervals."""
    out: List[Interval] = []
    for start, end in sorted((float(a), float(b)) for a, b in intervals if b > a):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _intersection(a: List[Interval], b: List[Interval]) -> float:
    """Seconds covered by both unions (each sorted and disjoint)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_report(comm: Sequence[Interval], waits: Sequence[Interval]) -> Dict[str, float]:
    """comm_seconds (union of the exchanges), exposed_seconds (of it, while the layer waited),
    hidden_seconds, overlap_ratio = hidden / comm (0 without communication), wait_seconds and
    queue_seconds (waiting while no exchange ran)."""
    c, w = merge(comm), merge(waits)
    comm_s = sum(b - a for a, b in c)
    wait_s = sum(b - a for a, b in w)
    exposed = _intersection(c, w)
    return {"comm_seconds": comm_s, "exposed_seconds": exposed, "hidden_seconds": comm_s - exposed,
            "overlap_ratio": (comm_s - exposed) / comm_s if comm_s > 0 else 0.0,
            "wait_seconds": wait_s, "queue_seconds": wait_s - exposed}
