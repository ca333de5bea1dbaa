"""PNG Gantt chart of a Timeline (matplotlib, Agg backend): ranks as rows, compute actions as bars."""
from __future__ import annotations

from typing import TYPE_CHECKING

from mindspore_hyper.schedule.actions import ActionKind

if TYPE_CHECKING:
    from mindspore_hyper.schedule.timeline import Timeline

__all__ = ["plot_gantt"]

# one hue per pass; later chunks of a rank are drawn darker
_COLORS = {
    ActionKind.FORWARD: ("#9ecae1", "#3182bd"),
    ActionKind.BACKWARD: ("#fc9272", "#cb181d"),
    ActionKind.BACKWARD_INPUT: ("#fdd0a2", "#e6550d"),
    ActionKind.BACKWARD_WEIGHT: ("#a1d99b", "#31a354"),
}
_LEGEND = {ActionKind.FORWARD: "forward", ActionKind.BACKWARD: "backward (input + weight)",
           ActionKind.BACKWARD_INPUT: "backward input", ActionKind.BACKWARD_WEIGHT: "backward weight"}


def plot_gantt(timeline: "Timeline", path: str) -> None:
    """Draw one bar per compute action, labelled with its microbatch, and write a PNG to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    span = timeline.makespan or 1.0
    fig, ax = plt.subplots(figsize=(min(max(8.0, span * 0.3), 24.0), 1.0 + 0.5 * timeline.num_ranks))
    used = set()
    for e in timeline.events:
        a = e.action
        if not a.is_compute:
            continue
        color = _COLORS[a.kind][min(a.chunk, 1)]
        ax.barh(e.rank, e.duration, left=e.start - timeline.start, height=0.8, color=color, edgecolor="black",
                linewidth=0.4)
        if e.duration >= span / 80:
            ax.text(e.start - timeline.start + e.duration / 2, e.rank, str(a.microbatch), ha="center",
                    va="center", fontsize=7)
        used.add(a.kind)
    ax.set_yticks(range(timeline.num_ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(timeline.num_ranks)])
    ax.invert_yaxis()
    ax.set_xlim(0, span)
    ax.set_xlabel("time")
    chunks = "; darker = a rank's later chunks" if any(e.action.chunk for e in timeline.events) else ""
    ax.set_title(f"{timeline.label}  (bubble {timeline.bubble_fraction:.1%}{chunks})")
    ax.legend(handles=[Patch(color=_COLORS[k][0], label=_LEGEND[k]) for k in _COLORS if k in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
