"""Timeline: chrome trace, PNG, measured records, measured costs fed back into the simulation."""
import json

import pytest

from mindspore_hyper.schedule import Action, ActionKind, ScheduleTimeline, Span, build_schedule, simulate_schedule


def test_chrome_trace_loads_with_the_trace_event_keys(tmp_path):
    s = build_schedule("zb_v", 4, 8, 2)
    t = simulate_schedule(s, p2p=0.1)
    path = tmp_path / "trace.json"
    t.to_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    for e in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "cat"} <= set(e)
        assert e["ts"] >= 0 and e["dur"] >= 0
    assert len(complete) == sum(len(actions) for actions in s.actions)
    assert sorted(e["args"]["name"] for e in meta if e["name"] == "thread_name") == [f"rank {r}" for r in range(4)]
    last = max(e["ts"] + e["dur"] for e in complete)
    assert last == pytest.approx(t.makespan * 1e6)
    recv = next(e for e in complete if e["cat"] == "recv")
    assert {"peer", "payload", "stage", "microbatch"} <= set(recv["args"])


@pytest.mark.parametrize("kind,v", [("gpipe", 1), ("interleaved_1f1b", 2)])
def test_plot_writes_a_png(tmp_path, kind, v):
    path = tmp_path / f"{kind}.png"
    simulate_schedule(build_schedule(kind, 4, 8, v)).plot(str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_from_records_rebuilds_the_same_figures():
    t = simulate_schedule(build_schedule("zb_h1", 4, 8), forward=1.0, backward_input=1.5, backward_weight=0.5, p2p=0.25)
    offset = 1000.0  # measured clocks do not start at zero
    again = ScheduleTimeline.from_records([(e.lane, e.action, e.start + offset, e.end + offset) for e in t.spans])
    assert again.makespan == t.makespan
    assert again.num_ranks == 4
    for r in range(4):
        assert again.bubble_time(r) == t.bubble_time(r)
        assert again.peak_inflight(r) == t.peak_inflight(r)
    assert again.bubble_fraction == t.bubble_fraction


def test_measured_costs_reproduce_the_timeline():
    s = build_schedule("1f1b", 4, 8)
    forward = [1.0, 2.0, 1.5, 0.5]
    t = simulate_schedule(s, forward=forward, backward_input=[1.0, 1.0, 2.0, 0.5], backward_weight=0.25)
    for e in t.spans:
        if e.action.kind is ActionKind.FORWARD:
            assert e.duration == forward[e.action.stage]
    costs = t.mean_costs()
    assert costs[(ActionKind.BACKWARD, 2)] == 2.25
    again = simulate_schedule(s, measured=costs)
    assert [(e.lane, e.action, e.start, e.end) for e in again.spans] == \
           [(e.lane, e.action, e.start, e.end) for e in t.spans]
    assert simulate_schedule(s, measured=lambda kind, stage: costs.get((kind, stage))).makespan == t.makespan


def test_measured_split_costs_price_a_full_backward():
    split = simulate_schedule(build_schedule("zb_h1", 2, 4), backward_input=2.0, backward_weight=0.5).mean_costs()
    full = simulate_schedule(build_schedule("1f1b", 2, 4), measured=split)
    assert {e.duration for e in full.spans if e.action.kind is ActionKind.BACKWARD} == {2.5}


def test_cost_errors_name_the_argument():
    s = build_schedule("1f1b", 2, 2)
    with pytest.raises(ValueError, match=r"forward: 3 costs given, expected one per virtual stage \(2\)"):
        simulate_schedule(s, forward=[1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"backward_weight\[1\]=-1.0: expected a finite number >= 0"):
        simulate_schedule(s, backward_weight=[1.0, -1.0])
    with pytest.raises(ValueError, match=r"backward_input='fast': expected a number or one number per virtual stage"):
        simulate_schedule(s, backward_input="fast")
    with pytest.raises(ValueError, match=r"p2p=-0.5: expected a finite latency >= 0"):
        simulate_schedule(s, p2p=-0.5)
    with pytest.raises(ValueError, match=r"measured costs replace \['forward'\]"):
        simulate_schedule(s, forward=2.0, measured={})
    with pytest.raises(ValueError, match=r"measured: no cost for \(forward, stage 0\)"):
        simulate_schedule(s, measured={(ActionKind.BACKWARD, 0): 1.0})
    zb = build_schedule("zb_h1", 2, 2)
    with pytest.raises(ValueError, match=r"measured: no cost for \(backward_input, stage \d\)"):
        simulate_schedule(zb, measured=simulate_schedule(s).mean_costs())


def test_timeline_checks():
    a = Action(ActionKind.FORWARD, 0, 0, 0)
    b = Action(ActionKind.FORWARD, 0, 0, 1)
    with pytest.raises(ValueError, match=r"rank 0 runs 'F s0 mb0' \[0.0, 2.0\] and 'F s0 mb1' \[1.0, 3.0\] at once"):
        ScheduleTimeline([Span.for_action(0, a, 0.0, 2.0), Span.for_action(0, b, 1.0, 3.0)])
    with pytest.raises(ValueError, match=r"end >= start"):
        Span.for_action(0, a, 2.0, 1.0)
    with pytest.raises(ValueError, match=r"events: a timeline needs at least one event"):
        ScheduleTimeline([])
    with pytest.raises(ValueError, match=r"num_ranks=1: events name rank 1"):
        ScheduleTimeline([Span.for_action(1, a, 0.0, 1.0)], num_ranks=1)
    t = ScheduleTimeline([Span.for_action(0, a, 0.0, 1.0)], num_ranks=2)
    assert t.bubble_time(1) == 1.0 and t.span_bubble_time(1) == 0.0 and t.bubble_fraction == 0.5
    with pytest.raises(ValueError, match=r"rank=2: expected a rank in \[0, 2\)"):
        t.bubble_time(2)
