"""Per-group timeline of MPMD work: measured durations placed by data dependencies.

In simulation every group runs in this one process, one after another. The timeline answers
when each piece of work would run if every group had its own devices: a task starts when its
group is free and every task it reads from has finished, so groups with no data dependency
overlap. Durations are measured seconds (or any one unit).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["GroupTask", "GroupTimeline"]


@dataclass(frozen=True)
class GroupTask:
    """One piece of work of a group, placed on the timeline.

    Attributes:
        index: position in submission order.
        group: the device group (or colocated role set) that runs it.
        label: what it is, e.g. "text_encoder forward" or "reward score".
        duration: measured seconds.
        depends_on: indices of earlier tasks whose outputs it reads.
        start, end: placement on the timeline (seconds from the step's start).
    """

    index: int
    group: str
    label: str
    duration: float
    depends_on: Tuple[int, ...]
    start: float
    end: float


@dataclass
class GroupTimeline:
    """Tasks of one step in submission order, each started as early as its group and inputs allow."""

    groups: Tuple[str, ...]
    tasks: List[GroupTask] = field(default_factory=list)

    def add(self, group: str, label: str, duration: float, depends_on: Sequence[int] = ()) -> int:
        """Place a task after its group's previous task and the tasks it depends on; returns its index.

        Raises:
            ValueError: an unknown group, a negative duration or a dependency on a later task.
        """
        if group not in self.groups:
            raise ValueError(f"group={group!r}: expected one of {list(self.groups)}")
        if duration < 0:
            raise ValueError(f"duration={duration}: expected seconds >= 0")
        index = len(self.tasks)
        deps = tuple(sorted(set(depends_on)))
        if any(d < 0 or d >= index for d in deps):
            raise ValueError(f"depends_on={list(deps)}: expected indices of earlier tasks (< {index})")
        ready = max((self.tasks[d].end for d in deps), default=0.0)
        free = max((t.end for t in self.tasks if t.group == group), default=0.0)
        start = max(ready, free)
        self.tasks.append(GroupTask(index, group, label, duration, deps, start, start + duration))
        return index

    @property
    def makespan(self) -> float:
        """End of the last task: the step's time with every group on its own devices."""
        return max((t.end for t in self.tasks), default=0.0)

    @property
    def serial_time(self) -> float:
        """Sum of all durations: the step's time with the groups run one after another."""
        return sum(t.duration for t in self.tasks)

    def busy_time(self, group: str) -> float:
        return sum(t.duration for t in self.tasks if t.group == group)

    def overlaps(self) -> List[Tuple[int, int]]:
        """Pairs of tasks of different groups that run at the same time (positive overlap)."""
        out = []
        for i, a in enumerate(self.tasks):
            for b in self.tasks[i + 1:]:
                if a.group != b.group and min(a.end, b.end) - max(a.start, b.start) > 0:
                    out.append((a.index, b.index))
        return out

    def summary(self) -> Dict[str, float]:
        return {"makespan": self.makespan, "serial_time": self.serial_time,
                "speedup": self.serial_time / self.makespan if self.makespan else 1.0}

    def to_chrome_trace(self, path: str) -> None:
        """Trace-event JSON (chrome://tracing, Perfetto): one thread per group, microseconds."""
        events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": i, "args": {"name": g}}
                  for i, g in enumerate(self.groups)]
        for t in self.tasks:
            events.append({"name": t.label, "ph": "X", "pid": 0, "tid": self.groups.index(t.group),
                           "ts": t.start * 1e6, "dur": t.duration * 1e6,
                           "args": {"index": t.index, "depends_on": list(t.depends_on)}})
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)

    def plot(self, path: str, title: Optional[str] = None) -> None:
        """PNG Gantt chart: one row per group, one labelled bar per task (matplotlib, Agg)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        span = self.makespan or 1.0
        fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * len(self.groups)))
        palette = ["#9ecae1", "#fc9272", "#a1d99b", "#fdd0a2", "#bcbddc", "#c7e9c0", "#fdae6b", "#d9d9d9"]
        for t in self.tasks:
            row = self.groups.index(t.group)
            ax.barh(row, t.duration, left=t.start, height=0.8, color=palette[row % len(palette)],
                    edgecolor="black", linewidth=0.4)
            if t.duration >= span / 30:
                ax.text(t.start + t.duration / 2, row, t.label, ha="center", va="center", fontsize=7)
        ax.set_yticks(range(len(self.groups)))
        ax.set_yticklabels(list(self.groups))
        ax.invert_yaxis()
        ax.set_xlim(0, span)
        ax.set_xlabel("seconds (measured durations, placed by data dependencies)")
        ax.set_title(title or f"makespan {self.makespan:.3g} s vs {self.serial_time:.3g} s one group after another")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    def __str__(self) -> str:
        lines = [f"{'group':<16} {'task':<28} {'start':>9} {'end':>9}"]
        for t in self.tasks:
            lines.append(f"{t.group:<16} {t.label:<28} {t.start:9.4f} {t.end:9.4f}")
        lines.append(f"makespan {self.makespan:.4f} s, one group after another {self.serial_time:.4f} s")
        return "\n".join(lines)
