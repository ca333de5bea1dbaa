"""TimelineView: what the Chrome-trace writer and the Gantt chart read of a timeline.

`Timeline` (timeline.py) is the implementation; it calls those writers (`to_chrome_trace`, `plot`),
so they cannot import it without an import circle. They name this protocol, which sits below
all three, as their argument's type.
"""
from __future__ import annotations

from typing import Hashable, Protocol, Tuple

from mindspore_hyper.schedule.span import Span

__all__ = ["TimelineView"]


class TimelineView(Protocol):
    """Spans on lanes with a label and a start (read-only).

    Attributes:
        spans: the spans, in the timeline's order.
        lanes: the lanes in display order (some may hold no span).
        label: a title for traces and charts ("" for none).
    """

    spans: Tuple[Span, ...]
    lanes: Tuple[Hashable, ...]
    label: str

    @property
    def start(self) -> float:
        """The timeline's start (seconds, the spans' clock)."""

    @property
    def makespan(self) -> float:
        """Seconds from `start` to the latest span end."""
