"""A timeline: spans on lanes (ranks or groups), with makespan, busy and idle time and overlap.

Every timeline of the package is one of these (or a subclass adding its own figures): the
pipeline schedule's (`ScheduleTimeline`), the MPMD groups' (`GroupTimeline`), the encoder
pipeline's (`EncoderTimeline`) and the measured PPO job's (`rlhf.measured_timeline`). The
Chrome-trace writer and the Gantt chart are free functions over it (chrome_trace.py, gantt.py),
which read it through the `TimelineView` protocol (timeline_view.py) to import nothing above them.
"""
from __future__ import annotations

from typing import Hashable, Iterable, List, Optional, Sequence, Tuple

from mindspore_hyper.schedule.chrome_trace import write_chrome_trace
from mindspore_hyper.schedule.gantt import plot_gantt
from mindspore_hyper.schedule.span import Span

__all__ = ["Timeline"]


class Timeline:
    """Spans on lanes, kept in the order given.

    A lane is busy during its busy spans; the rest of the makespan (waits, before its first and
    after its last span) is idle: its bubble. The makespan runs from `start` (the earliest span
    start unless an origin is given, e.g. the first request's arrival) to the latest end.

    Args:
        spans: the spans, any order (kept as given).
        lanes: the lanes in display order, including lanes with no span (default: the spans'
            lanes in order of first appearance).
        label: a title for traces and charts.
        origin: the timeline's start in the spans' clock (default: the earliest span start, 0 if
            there is none).

    Raises:
        ValueError: a span that is not a Span, a span on a lane not in `lanes`, repeated lanes,
            or an origin after a span's start.
    """

    def __init__(self, spans: Iterable[Span], lanes: Optional[Sequence[Hashable]] = None, label: str = "",
                 origin: Optional[float] = None):
        self.spans: Tuple[Span, ...] = tuple(spans)
        for s in self.spans:
            if not isinstance(s, Span):
                raise ValueError(f"spans: expected Span values, got {s!r}")
        if lanes is None:
            lanes = list(dict.fromkeys(s.lane for s in self.spans))
        self.lanes: Tuple[Hashable, ...] = tuple(lanes)
        if len(set(self.lanes)) != len(self.lanes):
            raise ValueError(f"lanes={list(self.lanes)}: a lane is named twice")
        known = set(self.lanes)
        for s in self.spans:
            if s.lane not in known:
                raise ValueError(f"spans: span '{s.label}' runs on lane {s.lane!r}, not one of {list(self.lanes)}")
        earliest = min((s.start for s in self.spans), default=0.0)
        if origin is not None and origin > earliest:
            raise ValueError(f"origin={origin!r}: after the earliest span start {earliest!r}")
        self.label = label
        self.origin = origin

    @property
    def start(self) -> float:
        """The timeline's start (seconds, the spans' clock)."""
        if self.origin is not None:
            return self.origin
        return min((s.start for s in self.spans), default=0.0)

    @property
    def end(self) -> float:
        """The latest span end (the start when there is no span)."""
        return max((s.end for s in self.spans), default=self.start)

    @property
    def makespan(self) -> float:
        """Seconds from `start` to the latest span end."""
        return self.end - self.start

    def of(self, lane: Optional[Hashable] = None, kind: Optional[str] = None) -> List[Span]:
        """The spans of `lane` and/or `kind` (None: any), in the timeline's order."""
        return [s for s in self.spans if (lane is None or s.lane == lane) and (kind is None or s.kind == kind)]

    def busy_spans(self, lane: Hashable) -> Tuple[Span, ...]:
        """`lane`'s busy spans in start order."""
        self._check_lane(lane)
        return tuple(sorted((s for s in self.spans if s.lane == lane and s.busy), key=lambda s: (s.start, s.end)))

    def busy_time(self, lane: Hashable) -> float:
        """Seconds `lane` spends in busy spans."""
        return sum(s.duration for s in self.busy_spans(lane))

    def bubble_time(self, lane: Hashable) -> float:
        """Seconds `lane` is idle within the makespan."""
        return self.makespan - self.busy_time(lane)

    def span_bubble_time(self, lane: Hashable) -> float:
        """Idle seconds between `lane`'s first busy start and its last busy end (0 with none)."""
        busy = self.busy_spans(lane)
        if not busy:
            return 0.0
        return max(s.end for s in busy) - busy[0].start - self.busy_time(lane)

    @property
    def bubble_fraction(self) -> float:
        """Idle time over total lane-time (len(lanes) * makespan); 0 for an empty makespan."""
        if self.makespan == 0:
            return 0.0
        return sum(self.bubble_time(lane) for lane in self.lanes) / (len(self.lanes) * self.makespan)

    def overlap(self, lane_a: Hashable, lane_b: Hashable) -> float:
        """Seconds during which both lanes are busy at once (summed over pairs of their busy spans)."""
        return sum(max(0.0, min(a.end, b.end) - max(a.start, b.start))
                   for a in self.busy_spans(lane_a) for b in self.busy_spans(lane_b))

    def to_chrome_trace(self, path: str) -> None:
        """Write the trace-event JSON that chrome://tracing and Perfetto load (one thread per lane)."""
        write_chrome_trace(self, path)

    def plot(self, path: str, title: Optional[str] = None) -> None:
        """Write a PNG Gantt chart: one row per lane, one bar per busy span, waits hatched."""
        plot_gantt(self, path, title=title, waits=True)

    def _check_lane(self, lane: Hashable) -> None:
        if lane not in self.lanes:
            raise ValueError(f"lane={lane!r}: expected one of {list(self.lanes)}")
