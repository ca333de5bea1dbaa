"""PNG Gantt chart of a Timeline (any `TimelineView`; matplotlib, Agg backend): lanes as rows, busy spans as bars."""
from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional, Union

from mindspore_hyper.schedule.span import Span, lane_name
from mindspore_hyper.schedule.timeline_view import TimelineView

__all__ = ["plot_gantt"]

_PALETTE = ("#9ecae1", "#fc9272", "#a1d99b", "#fdd0a2", "#bcbddc", "#c7e9c0", "#fdae6b", "#d9d9d9")

Colour = Union[Mapping[str, str], Callable[[Span], str], None]


def plot_gantt(timeline: TimelineView, path: str, *, title: Optional[str] = None, color: Colour = None,
               text: Optional[Callable[[Span], str]] = None, legend: Optional[Mapping[str, str]] = None,
               waits: bool = False, time_scale: float = 1.0, xlabel: str = "seconds",
               min_text_fraction: float = 1 / 40) -> None:
    """Draw one bar per busy span (and, with `waits`, a thin hatched bar per wait) and write a PNG.

    Args:
        timeline: the spans to draw, one row per lane in the timeline's lane order.
        path: where the PNG goes.
        title: the chart title (default: the timeline's label and makespan).
        color: a bar's colour: kind -> colour, or a function of the span (default: one palette
            colour per kind, in order of first appearance).
        text: the text in a bar (default: the span's label); drawn where the bar is at least
            `min_text_fraction` of the makespan wide.
        legend: kind -> legend entry, for the kinds drawn (default: no legend; needs `color` to be
            a mapping or the default).
        waits: draw non-busy spans as thin hatched bars instead of leaving them out.
        time_scale: factor from seconds to the axis unit (1e3 for an axis in ms).
        xlabel: the time axis label.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    by_kind: Dict[str, str] = {}

    def colour_of(span: Span) -> str:
        if callable(color):
            return color(span)
        if color is not None and span.kind in color:
            return color[span.kind]
        return by_kind.setdefault(span.kind, _PALETTE[len(by_kind) % len(_PALETTE)])

    rows = {lane: i for i, lane in enumerate(timeline.lanes)}
    origin = timeline.start
    makespan = timeline.makespan * time_scale or 1.0
    fig, ax = plt.subplots(figsize=(min(max(10.0, 0.3 * len(timeline.spans) / max(len(rows), 1)), 24.0),
                                    1.0 + 0.6 * len(rows)))
    drawn: Dict[str, str] = {}
    for s in timeline.spans:
        left, width = (s.start - origin) * time_scale, s.duration * time_scale
        if s.busy:
            fill = colour_of(s)
            drawn.setdefault(s.kind, fill)  # the legend shows a kind's first colour
            ax.barh(rows[s.lane], width, left=left, height=0.8, color=fill, edgecolor="black",
                    linewidth=0.4)
            if width >= makespan * min_text_fraction:
                ax.text(left + width / 2, rows[s.lane], s.label if text is None else text(s), ha="center",
                        va="center", fontsize=7)
        elif waits:
            ax.barh(rows[s.lane], width, left=left, height=0.3, color="white", edgecolor="grey", hatch="///",
                    linewidth=0.3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([lane_name(lane) for lane in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, makespan)
    ax.set_xlabel(xlabel)
    ax.set_title(title if title is not None else f"{timeline.label}  (makespan {timeline.makespan:.3g} s)")
    if legend:
        ax.legend(handles=[Patch(color=drawn[k], label=legend[k]) for k in legend if k in drawn],
                  loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
