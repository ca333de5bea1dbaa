"""Per-action measured costs: `simulate_schedule(action_cost=)` prices each compute action itself, and
`simulate_measured` reproduces a timeline from the per-action medians of measured ones."""
import pytest

from mindspore_hyper.pipeline.measured_costs import median_action_costs, simulate_measured
from mindspore_hyper.schedule import build_schedule, simulate_schedule
from mindspore_hyper.schedule.actions import ActionKind


def slow_microbatch_one(action):
    """Microbatch 1's forward on stage 0 takes 5x, every other action its unit cost."""
    if action.kind is ActionKind.FORWARD and action.stage == 0 and action.microbatch == 1:
        return 5.0
    return None


@pytest.mark.parametrize("kind", ["1f1b", "zb_h1", "interleaved_1f1b"])
def test_per_action_medians_reproduce_the_timeline_that_per_stage_means_smooth_over(kind):
    schedule = build_schedule(kind, 2, 4, 2 if kind == "interleaved_1f1b" else 1)
    run = simulate_schedule(schedule, action_cost=slow_microbatch_one)
    assert run.makespan > simulate_schedule(schedule).makespan  # the slow action is charged
    costs = median_action_costs([run, run, simulate_schedule(schedule)])  # two of three steps slow
    assert costs[(ActionKind.FORWARD, 0, 1)] == 5.0 and costs[(ActionKind.FORWARD, 0, 0)] == 1.0
    replay = simulate_measured(schedule, [run, run, simulate_schedule(schedule)])
    assert times(replay) == pytest.approx(times(run))  # every action starts and ends as in the slow steps
    assert replay.bubble_fraction == pytest.approx(run.bubble_fraction)
    means = simulate_schedule(schedule, measured=run.mean_costs())  # the per-stage mean spreads the 5 over 4 microbatches
    assert times(means) != pytest.approx(times(run))


def times(timeline):
    return [t for e in sorted(timeline.spans, key=lambda e: (e.lane, str(e.action))) for t in (e.start, e.end)]


def test_bad_action_costs_are_refused():
    schedule = build_schedule("1f1b", 2, 2)
    with pytest.raises(ValueError, match=r"action_cost\(.*\) = -1.0: expected a finite cost >= 0"):
        simulate_schedule(schedule, action_cost=lambda a: -1.0)
    with pytest.raises(ValueError, match="at least one measured timeline"):
        median_action_costs([])
