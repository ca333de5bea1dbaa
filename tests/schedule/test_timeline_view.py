"""Timeline implements the `TimelineView` protocol that the Chrome-trace writer and the Gantt
chart name as their argument's type (schedule/timeline_view.py: they cannot import timeline.py,
which calls them)."""
from protocol_members import mismatched_members

from mindspore_hyper.schedule.span import Span
from mindspore_hyper.schedule.timeline import Timeline
from mindspore_hyper.schedule.timeline_view import TimelineView


def test_timeline_provides_every_member_of_the_view():
    timeline = Timeline([Span(0, "F", 0.0, 1.0), Span(1, "B", 0.5, 2.0)], label="toy")
    assert mismatched_members(TimelineView, timeline) == []
