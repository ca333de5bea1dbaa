"""The measured PPO timeline (rlhf.measured_timeline): PhaseEvents of all processes as spans."""
import pytest

from mindspore_hyper.rlhf.measured_timeline import format_events, phase_timeline, plot_events
from mindspore_hyper.rlhf.process_phases import PhaseEvent


def events():
    return [PhaseEvent(0, 0, "generate", "actor", "generate 0", "run", 100.0, 100.5),
            PhaseEvent(0, 1, "generate", "actor", "logits", "receive", 99.0, 100.6),  # begun in the step before
            PhaseEvent(0, 1, "score", "critic", "values", "run", 100.6, 101.0),
            PhaseEvent(0, 0, "score", "actor", "values", "receive", 100.5, 101.1),
            PhaseEvent(1, 0, "generate", "actor", "generate 0", "run", 102.0, 102.5)]


def test_phase_timeline_lanes_waits_and_step():
    t = phase_timeline(events(), step=0)
    assert t.lanes == (0, 1) and t.start == 100.0 and t.makespan == pytest.approx(1.1)
    assert t.busy_time(0) == 0.5 and t.busy_time(1) == pytest.approx(0.4)
    wait = next(s for s in t.spans if s.label == "logits")
    assert not wait.busy and wait.start == 100.0  # cut at the step's first run
    assert phase_timeline(events()).end == 102.5


def test_format_and_plot(tmp_path):
    lines = format_events(events(), step=0).splitlines()
    assert lines[0].split() == ["rank", "step", "phase", "role", "unit", "start", "ms", "end", "ms"]
    assert [line.split() for line in lines[1:]] == [["0", "0", "generate", "actor", "generate", "0", "0.0", "500.0"],
                                                    ["1", "0", "score", "critic", "values", "600.0", "1000.0"]]
    path = tmp_path / "ppo.png"
    plot_events(events(), str(path), step=0)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
