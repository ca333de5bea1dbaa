"""What an encoder pipeline run did and when: per-group busy spans, latency, throughput, overlap."""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional

import numpy as np

from mindspore_hyper.schedule.gantt import plot_gantt
from mindspore_hyper.schedule.span import Span
from mindspore_hyper.schedule.timeline import Timeline

__all__ = ["EncoderTimeline", "stage_span"]

LM_GROUP = "lm"
STAGE_KINDS = ("encode", "lm", "encoder_backward")
_COLOURS = {"encode": "tab:blue", "lm": "tab:orange", "encoder_backward": "tab:green"}


def encoder_group(index: int) -> str:
    return f"encoder{index}"


def stage_span(group: str, kind: str, batch_id: int, start: float, end: float) -> Span:
    """One compute of one group on one batch: `kind` is "encode", "lm" or "encoder_backward";
    times in seconds; the batch id is `args["batch"]`.

    Raises:
        ValueError: an unknown kind or bad times.
    """
    if kind not in STAGE_KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {list(STAGE_KINDS)}")
    return Span(group, f"{kind} b{batch_id}", start, end, kind, args={"batch": int(batch_id)})


class EncoderTimeline(Timeline):
    """The spans of a run (simulated on virtual groups, or measured across processes), from the
    first arrival: one lane per group (sorted), spans in start order.

    Args:
        spans: the `stage_span`s, any order.
        arrivals: batch_id -> arrival time (same clock as the spans).
        sizes: batch_id -> number of requests.
    """

    def __init__(self, spans: Iterable[Span], arrivals: Mapping[int, float], sizes: Mapping[int, int]):
        spans = sorted(spans, key=lambda s: (s.start, s.lane))
        origin = min(list(arrivals.values()) + [s.start for s in spans])
        super().__init__(spans, lanes=sorted({s.lane for s in spans}), origin=origin)
        self.arrivals = dict(arrivals)
        self.sizes = dict(sizes)

    @property
    def groups(self):
        return self.lanes

    def consume_order(self) -> List[int]:
        """Batch ids in the order the language model took them."""
        return [s.args["batch"] for s in self.of(LM_GROUP, "lm")]

    def latencies(self) -> Dict[int, float]:
        """batch_id -> seconds from its arrival to the end of its language-model compute (every
        request of a batch has its batch's latency)."""
        return {s.args["batch"]: s.end - self.arrivals[s.args["batch"]] for s in self.of(LM_GROUP, "lm")}

    def request_latencies(self) -> np.ndarray:
        lat = self.latencies()
        return np.concatenate([np.full(self.sizes[b], v) for b, v in sorted(lat.items())]) if lat else np.zeros(0)

    def summary(self) -> Dict[str, float]:
        """Mean and p99 request latency (s), throughput (requests/s), makespan, overlap with the LM."""
        lat = self.request_latencies()
        overlap = sum(self.overlap(g, LM_GROUP) for g in self.lanes if g != LM_GROUP) if LM_GROUP in self.lanes else 0.0
        return {"latency_mean": float(lat.mean()), "latency_p99": float(np.percentile(lat, 99)),
                "throughput": float(lat.size / self.makespan), "makespan": self.makespan,
                "overlap": overlap, "requests": int(lat.size)}

    def plot(self, path: str, title: Optional[str] = None) -> None:
        """Gantt chart PNG: one row per group, bars labelled with batch ids."""
        plot_gantt(self, path, title=title or f"makespan {self.makespan:.2f} s", color=_COLOURS,
                   text=lambda s: str(s.args["batch"]), min_text_fraction=0.0)
