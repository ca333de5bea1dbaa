"""MPMD group-share rebalancing: microbatch and device shifts on hand-made loads, hysteresis, validation."""
import dataclasses
import random

import pytest

from mindspore_hyper.schedule import ScheduleError
from mindspore_hyper.schedule.rebalance import (GroupRebalancer, RebalancePolicy, ShareMove, ShareUnit,
                                                plan_group_shares)

MB, DEV = ShareUnit.MICROBATCHES, ShareUnit.DEVICES


def test_balanced_groups_do_not_move():
    plan = plan_group_shares([1.0, 1.0, 1.0], ["text", "vision", "audio"], (4, 4, 4), MB)
    assert plan.is_empty and plan.after == (4, 4, 4)
    assert plan.reason == "balanced: every group within [0.8, 1.2] x mean"


def test_noise_within_thresholds_does_not_move():
    plan = plan_group_shares([1.1, 0.9, 1.15], ["a", "b", "c"], (4, 4, 4), MB)
    assert plan.is_empty


def test_slow_group_hands_microbatches_to_the_fast_one():
    plan = plan_group_shares([1.0, 3.0], ["text", "vision"], (4, 4), MB)  # times 4 and 12
    plan.validate()
    assert plan.after == (6, 2) and plan.moves == (ShareMove("vision", "text", 2),)
    assert plan.predicted_before == (4.0, 12.0) and plan.predicted_after == (6.0, 6.0)
    assert plan.reason == ("vision at 1.50 x mean, text at 0.50 x mean: moving 2 microbatches cuts the bottleneck "
                           "by 50.0%")


def test_devices_go_to_the_group_with_more_work():
    plan = plan_group_shares([8.0, 24.0], ["actor", "critic"], (4, 4), DEV)  # times 2 and 6
    plan.validate()
    assert plan.after == (2, 6) and plan.moves == (ShareMove("actor", "critic", 2),)
    assert plan.predicted_after == (4.0, 4.0)


def test_three_groups_move_the_fewest_units():
    # per-microbatch costs 1, 1, 2 and 12 microbatches: the best bottleneck is 5 (5, 5, 2 -> times 5, 5, 4);
    # c must give 4 either way, and nothing else moves
    plan = plan_group_shares([1.0, 1.0, 2.0], ["a", "b", "c"], (4, 2, 6), MB)
    plan.validate()
    assert plan.predicted_after == (5.0, 5.0, 4.0)
    assert plan.after == (5, 5, 2)
    assert plan.moves == (ShareMove("c", "b", 3), ShareMove("c", "a", 1))


def test_min_share_is_kept():
    plan = plan_group_shares([1.0, 100.0], ["a", "b"], (4, 4), MB, min_share=2)
    assert plan.after == (6, 2)
    plan.validate(min_share=2)


def test_no_oscillation_between_equally_good_splits():
    plan = plan_group_shares([1.0, 1.0], ["a", "b"], (2, 1), MB)  # times 2 and 1; (1, 2) is as bad
    assert plan.is_empty and "cuts the bottleneck by 0.0% (< min_gain 5%)" in plan.reason
    rb = GroupRebalancer(["a", "b"], (2, 1), "microbatches")
    assert all(rb.observe([2.0, 1.0]).is_empty for _ in range(10)) and rb.split == (2, 1)


def test_rebalancer_shifts_once_and_holds_under_noise():
    per_microbatch = [1.0, 3.0]  # hidden truth
    rb = GroupRebalancer(["text", "vision"], (4, 4), "microbatches")
    rng = random.Random(3)
    moves = []
    for step in range(40):
        times = [c * n * rng.uniform(0.85, 1.15) for c, n in zip(per_microbatch, rb.split)]
        plan = rb.observe(times)
        if not plan.is_empty:
            moves.append((step, plan.after))
            rb.commit(plan)
    assert moves == [(0, (6, 2))]
    assert rb.predicted_times == pytest.approx((6.0, 6.0), rel=0.15)


def test_device_rebalancer_predicts_per_unit_work():
    rb = GroupRebalancer(["actor", "critic"], (4, 4), "devices", RebalancePolicy(alpha=1.0, cooldown_steps=1))
    plan = rb.observe([2.0, 6.0])
    rb.commit(plan)
    held = rb.observe([4.0, 4.0])
    assert held.is_empty and held.reason == "cooldown: 1 step(s) left after the last move"
    assert rb.predicted_times == (4.0, 4.0)
    assert rb.observe([4.0, 4.0]).reason.startswith("balanced")


def test_plan_validation_catches_tampering():
    plan = plan_group_shares([1.0, 3.0], ["text", "vision"], (4, 4), MB)
    with pytest.raises(ScheduleError, match=r"\[plan\] moves give \[4, 4\], expected \[6, 2\]"):
        dataclasses.replace(plan, moves=()).validate()
    with pytest.raises(ScheduleError, match=r"microbatches \[4, 4\] -> \[7, 2\]: the total must not change"):
        dataclasses.replace(plan, after=(7, 2)).validate()
    with pytest.raises(ScheduleError, match=r"expected a positive amount between two different groups"):
        dataclasses.replace(plan, moves=(ShareMove("vision", "vision", 2),)).validate()
    with pytest.raises(ScheduleError, match=r"expected a positive amount between two different groups"):
        dataclasses.replace(plan, moves=(ShareMove("audio", "text", 2),)).validate()
    with pytest.raises(ScheduleError, match=r"each group keeps at least 3"):
        plan.validate(min_share=3)
    with pytest.raises(ScheduleError, match=r"2 groups but 3 shares before"):
        dataclasses.replace(plan, before=(4, 4, 0)).validate()


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match=r"unit='gpus': expected one of \['microbatches', 'devices'\]"):
        GroupRebalancer(["a", "b"], (1, 1), "gpus")
    with pytest.raises(ValueError, match=r"min_share=0: expected an int >= 1"):
        GroupRebalancer(["a", "b"], (1, 1), "devices", min_share=0)
    with pytest.raises(ValueError, match=r"groups=\['a', 'a'\]: expected distinct names, one per share in \[1, 1\]"):
        GroupRebalancer(["a", "a"], (1, 1), "devices")
    with pytest.raises(ValueError, match=r"shares=\[0, 2\]: expected ints >= min_share=1"):
        GroupRebalancer(["a", "b"], (0, 2), "devices")
    with pytest.raises(ValueError, match=r"policy=0.3: expected a RebalancePolicy"):
        GroupRebalancer(["a", "b"], (1, 1), "devices", policy=0.3)
    rb = GroupRebalancer(["a", "b"], (1, 1), "devices")
    with pytest.raises(ValueError, match=r"times\[0\]=nan: expected a finite number >= 0"):
        rb.observe([float("nan"), 1.0])


def test_planner_checks_its_inputs():
    with pytest.raises(ValueError, match=r"unit_costs: 3 values given, expected 2"):
        plan_group_shares([1.0, 1.0, 1.0], ["a", "b"], (1, 1), "devices")
    with pytest.raises(ValueError, match=r"unit_costs\[1\]=-2.0: expected a finite number >= 0"):
        plan_group_shares([1.0, -2.0], ["a", "b"], (1, 1), "microbatches")
    with pytest.raises(ValueError, match=r"shares=\[1, 0\]: expected ints >= min_share=1"):
        plan_group_shares([1.0, 1.0], ["a", "b"], (1, 0), "microbatches")
    assert plan_group_shares([1.0, 3.0], ["a", "b"], (4, 4), "microbatches").after == (6, 2)
