"""Span and the generic Timeline: figures, checks, and the shared chrome-trace / Gantt writers."""
import json

import pytest

from mindspore_hyper.schedule import Span, Timeline
from mindspore_hyper.schedule.chrome_trace import chrome_trace_events
from mindspore_hyper.schedule.gantt import plot_gantt


def two_lanes() -> Timeline:
    # lane "a": busy [1, 3] and [4, 5], waits [3, 4]; lane 1 (a rank): busy [2, 6]
    return Timeline([Span("a", "x", 1.0, 3.0, "f"), Span("a", "wait", 3.0, 4.0, "recv", busy=False),
                     Span("a", "y", 4.0, 5.0, "g"), Span(1, "z", 2.0, 6.0, "f", args={"batch": 7})],
                    lanes=["a", 1, "idle"], label="t")


def test_figures_over_lanes():
    t = two_lanes()
    assert (t.start, t.end, t.makespan) == (1.0, 6.0, 5.0)
    assert t.busy_time("a") == 3.0 and t.bubble_time("a") == 2.0 and t.span_bubble_time("a") == 1.0
    assert t.busy_time("idle") == 0.0 and t.bubble_time("idle") == 5.0 and t.span_bubble_time("idle") == 0.0
    assert t.bubble_fraction == pytest.approx((2.0 + 1.0 + 5.0) / 15.0)
    assert t.overlap("a", 1) == 2.0  # [2, 3] and [4, 5]; the wait does not count
    assert [s.label for s in t.of("a")] == ["x", "wait", "y"] and [s.label for s in t.of(kind="f")] == ["x", "z"]
    late = Timeline(t.spans, lanes=t.lanes, origin=0.0)
    assert late.makespan == 6.0 and late.bubble_time(1) == 2.0


def test_span_and_timeline_checks():
    with pytest.raises(ValueError, match=r"Span\(x\): start=2.0, end=1.0; expected finite times with end >= start"):
        Span("a", "x", 2.0, 1.0)
    with pytest.raises(ValueError, match=r"Span\(x\): start=nan"):
        Span("a", "x", float("nan"), 1.0)
    with pytest.raises(ValueError, match=r"Span.lane=\[0\]: expected a hashable lane"):
        Span([0], "x", 0.0, 1.0)
    with pytest.raises(ValueError, match=r"span 'x' runs on lane 'b', not one of \['a'\]"):
        Timeline([Span("b", "x", 0.0, 1.0)], lanes=["a"])
    with pytest.raises(ValueError, match=r"lanes=\['a', 'a'\]: a lane is named twice"):
        Timeline([], lanes=["a", "a"])
    with pytest.raises(ValueError, match=r"origin=2.0: after the earliest span start 1.0"):
        Timeline([Span("a", "x", 1.0, 3.0)], origin=2.0)
    with pytest.raises(ValueError, match=r"lane='b': expected one of \['a'\]"):
        Timeline([Span("a", "x", 1.0, 3.0)]).busy_time("b")
    empty = Timeline([], lanes=["a"])
    assert empty.makespan == 0.0 and empty.bubble_fraction == 0.0


def test_chrome_trace_one_thread_per_lane(tmp_path):
    t = two_lanes()
    events = chrome_trace_events(t)
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {0: "a", 1: "rank 1", 2: "idle"}
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == ["t"]
    z = next(e for e in events if e["name"] == "z")
    assert (z["tid"], z["cat"], z["ts"], z["dur"], z["args"]) == (1, "f", 1e6, 4e6, {"batch": 7})
    path = tmp_path / "t.json"
    t.to_chrome_trace(str(path))
    assert json.loads(path.read_text())["traceEvents"] == events
    unlabelled = chrome_trace_events(Timeline(t.spans, lanes=t.lanes))
    assert not [e for e in unlabelled if e["name"] == "process_name"]


def test_gantt_writes_a_png_with_waits_colours_and_text(tmp_path):
    t = two_lanes()
    for i, options in enumerate([{}, {"waits": True, "color": {"f": "red"}, "legend": {"f": "F", "g": "G"}},
                                 {"color": lambda s: "blue", "text": lambda s: s.kind, "time_scale": 1e3}]):
        path = tmp_path / f"g{i}.png"
        plot_gantt(t, str(path), **options)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
