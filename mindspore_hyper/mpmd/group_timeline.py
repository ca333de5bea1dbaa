"""Per-group timeline of MPMD work: measured durations placed by data dependencies.

In simulation every group runs in this one process, one after another. The timeline answers
when each piece of work would run if every group had its own devices: a task starts when its
group is free and every task it reads from has finished, so groups with no data dependency
overlap. Durations are measured seconds (or any one unit).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from mindspore_hyper.schedule.gantt import plot_gantt
from mindspore_hyper.schedule.span import Span
from mindspore_hyper.schedule.timeline import Timeline

__all__ = ["GroupTimeline"]

_PALETTE = ("#9ecae1", "#fc9272", "#a1d99b", "#fdd0a2", "#bcbddc", "#c7e9c0", "#fdae6b", "#d9d9d9")


class GroupTimeline(Timeline):
    """Tasks of one step in submission order (one lane per group, from 0 s), each started as
    early as its group and inputs allow. A task is a Span whose args hold its `index` (position
    in submission order) and `depends_on` (indices of the tasks it reads from).

    Args:
        groups: the device groups (or colocated role sets), in display order.
    """

    def __init__(self, groups: Sequence[str]):
        super().__init__((), lanes=groups, origin=0.0)

    @property
    def groups(self) -> Tuple[str, ...]:
        return self.lanes

    def add(self, group: str, label: str, duration: float, depends_on: Sequence[int] = ()) -> int:
        """Place a task after its group's previous task and the tasks it depends on; returns its index.

        Raises:
            ValueError: an unknown group, a negative duration or a dependency on a later task.
        """
        if group not in self.lanes:
            raise ValueError(f"group={group!r}: expected one of {list(self.lanes)}")
        if duration < 0:
            raise ValueError(f"duration={duration}: expected seconds >= 0")
        index = len(self.spans)
        deps = tuple(sorted(set(depends_on)))
        if any(d < 0 or d >= index for d in deps):
            raise ValueError(f"depends_on={list(deps)}: expected indices of earlier tasks (< {index})")
        ready = max((self.spans[d].end for d in deps), default=0.0)
        free = max((s.end for s in self.spans if s.lane == group), default=0.0)
        start = max(ready, free)
        self.spans += (Span(group, label, start, start + duration, args={"index": index, "depends_on": deps}),)
        return index

    @property
    def serial_time(self) -> float:
        """Sum of all durations: the step's time with the groups run one after another."""
        return sum(s.duration for s in self.spans)

    def overlaps(self) -> List[Tuple[int, int]]:
        """Index pairs of tasks of different groups that run at the same time (positive overlap)."""
        out = []
        for i, a in enumerate(self.spans):
            for j, b in enumerate(self.spans[i + 1:], start=i + 1):
                if a.lane != b.lane and min(a.end, b.end) - max(a.start, b.start) > 0:
                    out.append((i, j))
        return out

    def summary(self) -> Dict[str, float]:
        return {"makespan": self.makespan, "serial_time": self.serial_time,
                "speedup": self.serial_time / self.makespan if self.makespan else 1.0}

    def plot(self, path: str, title: Optional[str] = None) -> None:
        """PNG Gantt chart: one row per group, one labelled bar per task."""
        rows = {g: i for i, g in enumerate(self.lanes)}
        plot_gantt(self, path, color=lambda s: _PALETTE[rows[s.lane] % len(_PALETTE)],
                   xlabel="seconds (measured durations, placed by data dependencies)",
                   title=title or f"makespan {self.makespan:.3g} s vs {self.serial_time:.3g} s one group after another")

    def __str__(self) -> str:
        lines = [f"{'group':<16} {'task':<28} {'start':>9} {'end':>9}"]
        for s in self.spans:
            lines.append(f"{s.lane:<16} {s.label:<28} {s.start:9.4f} {s.end:9.4f}")
        lines.append(f"makespan {self.makespan:.4f} s, one group after another {self.serial_time:.4f} s")
        return "\n".join(lines)
