"""The timeline of a pipeline schedule, simulated or measured: one lane per rank, one span per
action, with the pipeline's own figures (live activations, mean costs per kind and stage)."""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Tuple

from mindspore_hyper.schedule.actions import ActionKind, BACKWARD_KINDS, Action
from mindspore_hyper.schedule.gantt import plot_gantt
from mindspore_hyper.schedule.span import Span
from mindspore_hyper.schedule.timeline import Timeline

__all__ = ["ScheduleTimeline"]

# one hue per pass; later chunks of a rank are drawn darker
_COLORS = {
    ActionKind.FORWARD.value: ("#9ecae1", "#3182bd"),
    ActionKind.BACKWARD.value: ("#fc9272", "#cb181d"),
    ActionKind.BACKWARD_INPUT.value: ("#fdd0a2", "#e6550d"),
    ActionKind.BACKWARD_WEIGHT.value: ("#a1d99b", "#31a354"),
}
_LEGEND = {ActionKind.FORWARD.value: "forward", ActionKind.BACKWARD.value: "backward (input + weight)",
           ActionKind.BACKWARD_INPUT.value: "backward input", ActionKind.BACKWARD_WEIGHT.value: "backward weight"}


class ScheduleTimeline(Timeline):
    """Action spans (`Span.for_action`) of all ranks, sorted by (rank, start, end).

    A rank is busy while it runs a compute action; everything else up to the makespan (waiting
    in a receive, before its first or after its last action) is bubble. The makespan runs from
    the earliest start to the latest end over all ranks: a synchronous optimizer step ends the
    pipeline step for everyone.

    Args:
        spans: the actions' spans; compute spans of one rank must not overlap.
        num_ranks: number of ranks (default: highest rank in `spans` + 1).
        label: a title for traces and plots.

    Raises:
        ValueError: no spans, a span without an action, a rank out of range, or overlapping
            compute on one rank.
    """

    def __init__(self, spans: Iterable[Span], num_ranks: Optional[int] = None, label: str = ""):
        spans = tuple(spans)
        if not spans:
            raise ValueError("events: a timeline needs at least one event")
        for s in spans:
            if not isinstance(s, Span) or s.action is None or isinstance(s.lane, bool) or not isinstance(s.lane, int):
                raise ValueError(f"spans: {s!r} is not the span of a schedule action on a rank (build it with "
                                 f"Span.for_action)")
        spans = tuple(sorted(spans, key=lambda s: (s.lane, s.start, s.end)))
        highest = max(s.lane for s in spans)
        if num_ranks is None:
            num_ranks = highest + 1
        if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks <= highest:
            raise ValueError(f"num_ranks={num_ranks!r}: events name rank {highest}")
        self.num_ranks = num_ranks
        super().__init__(spans, lanes=range(num_ranks), label=label)
        for rank in range(num_ranks):
            compute = self.busy_spans(rank)
            for before, after in zip(compute, compute[1:]):
                if after.start < before.end:
                    raise ValueError(f"events: rank {rank} runs '{before.label}' [{before.start}, {before.end}] "
                                     f"and '{after.label}' [{after.start}, {after.end}] at once")

    @classmethod
    def from_records(cls, records: Iterable[Tuple[int, Action, float, float]], num_ranks: Optional[int] = None,
                     label: str = "") -> "ScheduleTimeline":
        """A timeline from (rank, action, start, end) records, e.g. measured in a real run."""
        return cls((Span.for_action(rank, action, float(start), float(end)) for rank, action, start, end in records),
                   num_ranks=num_ranks, label=label)

    def peak_inflight(self, rank: int) -> int:
        """Most (stage, microbatch) activations alive on `rank` at once.

        An activation is alive from the start of its forward to the end of its last backward
        (the weight gradient when the backward is split, since it still reads the stage input).
        """
        compute = self.busy_spans(rank)
        last_backward: Dict[Tuple[int, int], int] = {}
        for index, s in enumerate(compute):
            if s.action.kind in BACKWARD_KINDS:
                last_backward[(s.action.stage, s.action.microbatch)] = index
        alive = peak = 0
        for index, s in enumerate(compute):
            key = (s.action.stage, s.action.microbatch)
            if s.action.kind is ActionKind.FORWARD:
                alive += 1
                peak = max(peak, alive)
            elif last_backward[key] == index:
                alive -= 1
        return peak

    def mean_costs(self) -> Dict[Tuple[ActionKind, int], float]:
        """Mean duration per (compute kind, stage): the `measured` input of `simulate`."""
        durations: Dict[Tuple[ActionKind, int], List[float]] = defaultdict(list)
        for s in self.spans:
            if s.busy:
                durations[(s.action.kind, s.action.stage)].append(s.duration)
        return {key: sum(values) / len(values) for key, values in durations.items()}

    def plot(self, path: str, title: Optional[str] = None) -> None:
        """Write a PNG Gantt chart: one row per rank, one bar per compute action (its microbatch)."""
        chunks = "; darker = a rank's later chunks" if any(s.action.chunk for s in self.spans) else ""
        plot_gantt(self, path, title=title or f"{self.label}  (bubble {self.bubble_fraction:.1%}{chunks})",
                   color=lambda s: _COLORS[s.kind][min(s.action.chunk, 1)], text=lambda s: str(s.action.microbatch),
                   legend=_LEGEND, xlabel="time", min_text_fraction=1 / 80)

    def _check_lane(self, lane) -> None:
        if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < self.num_ranks:
            raise ValueError(f"rank={lane!r}: expected a rank in [0, {self.num_ranks})")
