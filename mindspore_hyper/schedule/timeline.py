"""When each action ran: a simulated or a measured timeline, and the bubble/memory figures of it."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

from mindspore_hyper.schedule.actions import Action, ActionKind, BACKWARD_KINDS

__all__ = ["TimelineEvent", "Timeline"]


@dataclass(frozen=True)
class TimelineEvent:
    """One action's run.

    Attributes:
        rank: the rank that ran it.
        action: what ran.
        start, end: seconds (simulated units for a simulation), end >= start.
    """

    rank: int
    action: Action
    start: float
    end: float

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"TimelineEvent.rank={self.rank!r}: expected an int >= 0")
        if not isinstance(self.action, Action):
            raise ValueError(f"TimelineEvent.action={self.action!r}: expected an Action")
        if not (math.isfinite(self.start) and math.isfinite(self.end)) or self.end < self.start:
            raise ValueError(f"TimelineEvent({self.action}): start={self.start!r}, end={self.end!r}; expected "
                             f"finite times with end >= start")

    @property
    def duration(self) -> float:
        return self.end - self.start


class Timeline:
    """Events of all ranks, with the step's makespan, idle (bubble) time and live activations.

    A rank is busy while it runs a compute action; everything else up to the makespan (waiting
    in a receive, before its first or after its last action) is bubble. The makespan runs from
    the earliest start to the latest end over all ranks: a synchronous optimizer step ends the
    pipeline step for everyone.

    Args:
        events: the actions' runs; compute runs of one rank must not overlap.
        num_ranks: number of ranks (default: highest rank in `events` + 1).
        label: a title for traces and plots.

    Raises:
        ValueError: no events, a rank out of range, or overlapping compute on one rank.
    """

    def __init__(self, events: Iterable[TimelineEvent], num_ranks: Optional[int] = None, label: str = ""):
        self.events: Tuple[TimelineEvent, ...] = tuple(sorted(events, key=lambda e: (e.rank, e.start, e.end)))
        if not self.events:
            raise ValueError("events: a timeline needs at least one event")
        highest = max(e.rank for e in self.events)
        if num_ranks is None:
            num_ranks = highest + 1
        if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks <= highest:
            raise ValueError(f"num_ranks={num_ranks!r}: events name rank {highest}")
        self.num_ranks = num_ranks
        self.label = label
        self.start = min(e.start for e in self.events)
        self.makespan = max(e.end for e in self.events) - self.start
        for rank in range(num_ranks):
            compute = self.compute_events(rank)
            for before, after in zip(compute, compute[1:]):
                if after.start < before.end:
                    raise ValueError(f"events: rank {rank} runs '{before.action}' [{before.start}, {before.end}] "
                                     f"and '{after.action}' [{after.start}, {after.end}] at once")

    @classmethod
    def from_records(cls, records: Iterable[Tuple[int, Action, float, float]], num_ranks: Optional[int] = None,
                     label: str = "") -> "Timeline":
        """A timeline from (rank, action, start, end) records, e.g. measured in a real run."""
        return cls((TimelineEvent(rank, action, float(start), float(end)) for rank, action, start, end in records),
                   num_ranks=num_ranks, label=label)

    def compute_events(self, rank: int) -> Tuple[TimelineEvent, ...]:
        """Rank `rank`'s compute runs in start order."""
        return tuple(e for e in self.events if e.rank == rank and e.action.is_compute)

    def busy_time(self, rank: int) -> float:
        """Time `rank` spends in compute actions."""
        return sum(e.duration for e in self.compute_events(rank))

    def bubble_time(self, rank: int) -> float:
        """Time `rank` is idle within the makespan."""
        self._check_rank(rank)
        return self.makespan - self.busy_time(rank)

    def span_bubble_time(self, rank: int) -> float:
        """Idle time between `rank`'s first compute start and last compute end.

        This is the bubble the zero-bubble papers report: ranks start one forward apart and, with
        no synchronisation at the step boundary, each rank's next step can start as soon as it
        finishes, so only idle inside a rank's own span is lost.
        """
        self._check_rank(rank)
        compute = self.compute_events(rank)
        if not compute:
            return 0.0
        return max(e.end for e in compute) - compute[0].start - self.busy_time(rank)

    @property
    def bubble_fraction(self) -> float:
        """Idle time over total rank-time (num_ranks * makespan)."""
        if self.makespan == 0:
            return 0.0
        return sum(self.bubble_time(r) for r in range(self.num_ranks)) / (self.num_ranks * self.makespan)

    def peak_inflight(self, rank: int) -> int:
        """Most (stage, microbatch) activations alive on `rank` at once.

        An activation is alive from the start of its forward to the end of its last backward
        (the weight gradient when the backward is split, since it still reads the stage input).
        """
        self._check_rank(rank)
        compute = self.compute_events(rank)
        last_backward: Dict[Tuple[int, int], int] = {}
        for index, e in enumerate(compute):
            if e.action.kind in BACKWARD_KINDS:
                last_backward[(e.action.stage, e.action.microbatch)] = index
        alive = peak = 0
        for index, e in enumerate(compute):
            key = (e.action.stage, e.action.microbatch)
            if e.action.kind is ActionKind.FORWARD:
                alive += 1
                peak = max(peak, alive)
            elif last_backward[key] == index:
                alive -= 1
        return peak

    def mean_costs(self) -> Dict[Tuple[ActionKind, int], float]:
        """Mean duration per (compute kind, stage): the `measured` input of `simulate`."""
        durations: Dict[Tuple[ActionKind, int], List[float]] = defaultdict(list)
        for e in self.events:
            if e.action.is_compute:
                durations[(e.action.kind, e.action.stage)].append(e.duration)
        return {key: sum(values) / len(values) for key, values in durations.items()}

    def to_chrome_trace(self, path: str) -> None:
        """Write the trace-event JSON that chrome://tracing and Perfetto load (one thread per rank)."""
        from mindspore_hyper.schedule.chrome_trace import write_chrome_trace

        write_chrome_trace(self, path)

    def plot(self, path: str) -> None:
        """Write a PNG Gantt chart: one row per rank, one bar per compute action."""
        from mindspore_hyper.schedule.gantt import plot_gantt

        plot_gantt(self, path)

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.num_ranks:
            raise ValueError(f"rank={rank!r}: expected a rank in [0, {self.num_ranks})")
