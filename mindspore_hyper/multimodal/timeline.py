"""What an encoder pipeline run did and when: per-group busy intervals, latency, throughput, overlap."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Tuple

import numpy as np

__all__ = ["StageEvent", "PipelineTimeline"]

LM_GROUP = "lm"


def encoder_group(index: int) -> str:
    return f"encoder{index}"


@dataclass(frozen=True)
class StageEvent:
    """One compute of one group: kind is "encode", "lm" or "encoder_backward"; times in seconds."""

    group: str
    kind: str
    batch_id: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


class PipelineTimeline:
    """Events of a run (simulated on virtual groups, or measured across processes).

    Args:
        events: the StageEvents, any order.
        arrivals: batch_id -> arrival time (same clock as the events).
        sizes: batch_id -> number of requests.
    """

    def __init__(self, events: Iterable[StageEvent], arrivals: Mapping[int, float], sizes: Mapping[int, int]):
        self.events: Tuple[StageEvent, ...] = tuple(sorted(events, key=lambda e: (e.start, e.group)))
        self.arrivals = dict(arrivals)
        self.sizes = dict(sizes)

    def of(self, group: str = None, kind: str = None) -> List[StageEvent]:
        return [e for e in self.events if (group is None or e.group == group) and (kind is None or e.kind == kind)]

    @property
    def groups(self) -> Tuple[str, ...]:
        return tuple(sorted({e.group for e in self.events}))

    @property
    def start(self) -> float:
        return min(self.arrivals.values())

    @property
    def makespan(self) -> float:
        """Seconds from the first arrival to the end of the last compute."""
        return max(e.end for e in self.events) - self.start

    def busy_time(self, group: str) -> float:
        return sum(e.duration for e in self.of(group))

    def overlap(self, group_a: str, group_b: str) -> float:
        """Seconds during which both groups compute at once (the pipelining gain)."""
        total = 0.0
        for a in self.of(group_a):
            for b in self.of(group_b):
                total += max(0.0, min(a.end, b.end) - max(a.start, b.start))
        return total

    def encode_completion_order(self) -> List[int]:
        return [e.batch_id for e in sorted(self.of(kind="encode"), key=lambda e: e.end)]

    def consume_order(self) -> List[int]:
        return [e.batch_id for e in self.of(LM_GROUP, "lm")]

    def latencies(self) -> Dict[int, float]:
        """batch_id -> seconds from its arrival to the end of its language-model compute (every
        request of a batch has its batch's latency)."""
        return {e.batch_id: e.end - self.arrivals[e.batch_id] for e in self.of(LM_GROUP, "lm")}

    def request_latencies(self) -> np.ndarray:
        lat = self.latencies()
        return np.concatenate([np.full(self.sizes[b], v) for b, v in sorted(lat.items())]) if lat else np.zeros(0)

    def summary(self) -> Dict[str, float]:
        """Mean and p99 request latency (s), throughput (requests/s), makespan, overlap with the LM."""
        lat = self.request_latencies()
        overlap = sum(self.overlap(g, LM_GROUP) for g in self.groups if g != LM_GROUP)
        return {"latency_mean": float(lat.mean()), "latency_p99": float(np.percentile(lat, 99)),
                "throughput": float(lat.size / self.makespan), "makespan": self.makespan,
                "overlap": overlap, "requests": int(lat.size)}

    def plot(self, path: str, title: str = "") -> None:
        """Gantt chart PNG: one row per group, bars labelled with batch ids (matplotlib, Agg)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        colours = {"encode": "tab:blue", "lm": "tab:orange", "encoder_backward": "tab:green"}
        groups = self.groups
        fig, ax = plt.subplots(figsize=(10, 0.6 * len(groups) + 1.2))
        for row, group in enumerate(groups):
            for e in self.of(group):
                ax.barh(row, e.duration, left=e.start - self.start, color=colours[e.kind], edgecolor="black")
                ax.text(e.start - self.start + e.duration / 2, row, str(e.batch_id), ha="center", va="center",
                        fontsize=7)
        ax.set_yticks(range(len(groups)))
        ax.set_yticklabels(groups)
        ax.invert_yaxis()
        ax.set_xlabel("seconds")
        ax.set_title(title or f"makespan {self.makespan:.2f} s")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)

    def to_chrome_trace(self, path: str) -> None:
        """Trace-event JSON (chrome://tracing, ui.perfetto.dev): one thread per group."""
        tids = {g: i for i, g in enumerate(self.groups)}
        origin = self.start
        trace = [{"name": f"{e.kind} b{e.batch_id}", "ph": "X", "pid": 0, "tid": tids[e.group],
                  "ts": (e.start - origin) * 1e6, "dur": e.duration * 1e6, "args": {"batch": e.batch_id}}
                 for e in self.events]
        trace += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": g}} for g, t in tids.items()]
        with open(path, "w") as f:
            json.dump({"traceEvents": trace}, f)
