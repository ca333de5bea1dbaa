"""Stage-boundary rebalancing: decisions on hand-made load vectors, hysteresis, plan validation."""
import dataclasses
import random

import pytest

from mindspore_hyper.schedule import ScheduleError
from mindspore_hyper.schedule.rebalance import (LayerSpec, LoadHistory, RebalancePolicy, StageRebalancer,
                                                detect_imbalance, layer_costs_from_stage_times, plan_stage_move)


def make_layers(n):
    return [LayerSpec(f"layer{i}", 1.0, (f"layer{i}.weight", f"layer{i}.bias"),
                      (f"moment1.layer{i}.weight", f"moment2.layer{i}.weight")) for i in range(n)]


def plan_for(stage_times, counts, policy=RebalancePolicy()):
    layers = make_layers(sum(counts))
    return plan_stage_move(layer_costs_from_stage_times(stage_times, counts, layers), layers, counts, policy)


def test_ema_uses_the_stated_alpha():
    h = LoadHistory(0.3).observe([1.0, 1.0]).observe([2.0, 0.0])
    assert h.values == pytest.approx((1.3, 0.7)) and h.observations == 2


def test_detect_thresholds_are_strict():
    imb = detect_imbalance([1.2, 1.2, 0.6, 1.0])  # mean 1.0
    assert imb.overloaded == () and imb.underloaded == (2,) and not imb.balanced
    imb = detect_imbalance([1.21, 0.99, 0.9, 0.9])
    assert imb.overloaded == (0,) and imb.underloaded == ()


def test_balanced_stages_do_not_move():
    plan = plan_for([1.0, 1.0, 1.0, 1.0], (4, 4, 4, 4))
    assert plan.is_empty and plan.after == plan.before == (4, 4, 4, 4)
    assert plan.reason == "balanced: every stage within [0.8, 1.2] x mean"


def test_noise_within_thresholds_does_not_move():
    plan = plan_for([1.1, 0.9, 1.15, 0.85], (4, 4, 4, 4))
    assert plan.is_empty and plan.reason.startswith("balanced")


def test_one_hot_last_stage_hands_its_first_layer_to_the_previous_stage():
    plan = plan_for([1.0, 1.0, 1.0, 2.0], (4, 4, 4, 4))  # stage 3's layers cost 0.5, the others 0.25
    plan.validate()
    assert plan.after == (4, 4, 5, 3)
    assert [(m.layer, m.source_stage, m.target_stage) for m in plan.moves] == [(12, 3, 2)]
    move = plan.moves[0]
    assert move.name == "layer12" and move.parameters == ("layer12.weight", "layer12.bias")
    assert move.optimizer_states == ("moment1.layer12.weight", "moment2.layer12.weight")
    assert plan.predicted_before == (1.0, 1.0, 1.0, 2.0) and plan.predicted_after == (1.0, 1.0, 1.5, 1.5)
    assert plan.reason == "stage 3 at 1.60 x mean: moving 1 layer(s) cuts the bottleneck by 25.0%"


def test_one_hot_first_stage_of_two():
    plan = plan_for([2.0, 1.0], (3, 3))
    assert plan.reason == ("stage 0 at 1.33 x mean, stage 1 at 0.67 x mean: moving 1 layer(s) cuts the bottleneck "
                           "by 16.7%")
    assert plan.after == (2, 4)
    assert [(m.layer, m.source_stage, m.target_stage) for m in plan.moves] == [(2, 0, 1)]
    assert plan.predicted_after == pytest.approx((4 / 3, 5 / 3))


def test_hot_middle_stage_moves_both_boundaries():
    plan = plan_for([1.0, 3.0, 1.0], (4, 4, 4))  # stage 1's layers cost 0.75, the others 0.25
    plan.validate()
    # best bottleneck 1.75: stage 1 keeps layers 5..6, stage 0 takes 4, stage 2 takes 7
    assert max(plan.predicted_after) == pytest.approx(1.75) and plan.after == (5, 2, 5)
    assert [(m.layer, m.source_stage, m.target_stage) for m in plan.moves] == [(4, 1, 0), (7, 1, 2)]


def test_layer_weights_split_a_stage_time():
    layers = [LayerSpec("a", 1.0), LayerSpec("b", 3.0), LayerSpec("c", 2.0)]
    assert layer_costs_from_stage_times([4.0, 6.0], (2, 1), layers) == (1.0, 3.0, 6.0)


def test_no_oscillation_between_equally_good_splits():
    # 3 equal layers on 2 stages: (2, 1) is overloaded, but (1, 2) is just as bad mirrored
    plan = plan_for([2.0, 1.0], (2, 1))
    assert plan.is_empty
    assert plan.reason == ("stage 0 at 1.33 x mean, stage 1 at 0.67 x mean, but the best split cuts the bottleneck "
                           "by 0.0% (< min_gain 5%)")
    rb = StageRebalancer(make_layers(3), (2, 1))
    assert all(rb.observe([2.0, 1.0]).is_empty for _ in range(20)) and rb.split == (2, 1)


def test_rebalancer_moves_once_and_then_holds_under_noise():
    layer_cost = [2 / 3] * 3 + [1 / 3] * 3  # the hidden truth: the first three layers are twice as slow
    rb = StageRebalancer(make_layers(6), (3, 3), RebalancePolicy(cooldown_steps=2))
    rng = random.Random(7)
    moves = []
    for step in range(40):
        owner = [s for s, n in enumerate(rb.split) for _ in range(n)]
        times = [sum(c for c, o in zip(layer_cost, owner) if o == s) * rng.uniform(0.9, 1.1) for s in range(2)]
        plan = rb.observe(times)
        if not plan.is_empty:
            moves.append((step, plan.before, plan.after))
            rb.commit(plan)
    assert moves == [(0, (3, 3), (2, 4))]


def test_cooldown_after_a_commit():
    rb = StageRebalancer(make_layers(6), (3, 3), RebalancePolicy(cooldown_steps=2))
    plan = rb.observe([2.0, 1.0])
    rb.commit(plan)
    assert rb.split == (2, 4)
    # the measured times now look hot on stage 1, but the rebalancer waits two observations
    held = [rb.observe([0.5, 3.0]) for _ in range(2)]
    assert [p.reason for p in held] == ["cooldown: 2 step(s) left after the last move",
                                        "cooldown: 1 step(s) left after the last move"]
    assert all(p.is_empty and p.before == (2, 4) for p in held)
    rb.commit(held[0])  # committing an empty plan changes nothing and starts no cool-down
    assert not rb.observe([0.5, 3.0]).is_empty


def test_layers_keep_their_history_when_they_move():
    rb = StageRebalancer(make_layers(6), (3, 3), RebalancePolicy(alpha=0.5))
    rb.commit(rb.observe([2.0, 1.0]))
    assert rb.predicted_layer_costs == pytest.approx((2 / 3,) * 3 + (1 / 3,) * 3)
    rb.observe([4 / 3, 5 / 3])  # the true stage times under the new split (2, 4)
    # layer 2 moved to stage 1: its new sample is a quarter of stage 1's time, blended with its own past
    moved, stayed = 0.5 * 2 / 3 + 0.5 * 5 / 12, 0.5 / 3 + 0.5 * 5 / 12
    assert rb.predicted_layer_costs == pytest.approx((2 / 3, 2 / 3, moved, stayed, stayed, stayed))


def test_plan_validation_catches_tampering():
    plan = plan_for([1.0, 1.0, 1.0, 2.0], (4, 4, 4, 4))
    with pytest.raises(ScheduleError, match=r"\[plan\] moves \(layer, from, to\) \[\] do not turn \[4, 4, 4, 4\] into "
                                            r"\[4, 4, 5, 3\]; expected \[\(12, 3, 2\)\]"):
        dataclasses.replace(plan, moves=()).validate()
    with pytest.raises(ScheduleError, match=r"every stage needs a layer and the total must not change"):
        dataclasses.replace(plan, after=(4, 4, 8, 0)).validate()
    with pytest.raises(ScheduleError, match=r"before has 4 stages, after has 3"):
        dataclasses.replace(plan, after=(4, 4, 8)).validate()
    rb = StageRebalancer(make_layers(16), (5, 3, 4, 4))
    with pytest.raises(ScheduleError, match=r"plan starts from \[4, 4, 4, 4\], the current split is \[5, 3, 4, 4\]"):
        rb.commit(plan)


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match=r"LayerSpec\('x'\).weight=0: expected a finite number > 0"):
        LayerSpec("x", 0)
    with pytest.raises(ValueError, match=r"layer_counts=\[3, 2\]: expected ints >= 1 summing to the 6 layers"):
        StageRebalancer(make_layers(6), (3, 2))
    rb = StageRebalancer(make_layers(6), (3, 3))
    with pytest.raises(ValueError, match=r"times: 3 values given, expected 2"):
        rb.observe([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"times\[1\]=-1.0: expected a finite number >= 0"):
        rb.observe([1.0, -1.0])
    for field, value, expected in [("alpha", 0.0, r"in \(0, 1\]"), ("overload", 1.0, "> 1"),
                                   ("underload", 1.0, r"in \[0, 1\)"), ("min_gain", -0.1, r"in \[0, 1\)")]:
        with pytest.raises(ValueError, match=rf"RebalancePolicy.{field}={value}: expected a number {expected}"):
            RebalancePolicy(**{field: value})
    with pytest.raises(ValueError, match=r"RebalancePolicy.cooldown_steps=-1: expected an int >= 0"):
        RebalancePolicy(cooldown_steps=-1)


def test_planner_checks_its_inputs():
    layers = make_layers(4)
    with pytest.raises(ValueError, match=r"layer_costs: 3 values given, expected 4"):
        plan_stage_move([1.0, 1.0, 1.0], layers, (2, 2))
    with pytest.raises(ValueError, match=r"layer_counts=\[4, 0\]: expected ints >= 1 summing to the 4 layers"):
        plan_stage_move([1.0] * 4, layers, (4, 0))
    with pytest.raises(ValueError, match=r"loads: expected at least one value"):
        detect_imbalance([])
