"""Microbatch-share rebalancing (the msrun dynamic scheduler's plans) and msrun-sized configs."""
import pytest

from mindspore_hyper.mpmd import for_processes
from mindspore_hyper.mpmd.share_rebalancing import ShareRebalancing, proportional_shares
from mindspore_hyper.schedule.rebalance import GroupSharePlan, RebalancePolicy, ShareMove
from mindspore_hyper.strategy.config import load_parallel_config
from paths import CONFIGS


def test_proportional_shares():
    assert proportional_shares(8, [2, 1, 1]) == (4, 2, 2)
    assert proportional_shares(3, [8, 4, 4]) == (1, 1, 1)
    assert proportional_shares(10, [1, 1, 1]) == (4, 3, 3)
    with pytest.raises(ValueError, match="a batch of 2 rows cannot give each of 3 dynamic groups a row"):
        proportional_shares(2, [1, 1, 1])


def test_rows_follow_the_shares_and_a_slow_group_gives_rows_away():
    sharing = ShareRebalancing(["a", "b", "c"], (4, 2, 2), RebalancePolicy(cooldown_steps=0))
    assert sharing.rows() == {"a": slice(0, 4), "b": slice(4, 6), "c": slice(6, 8)}
    # b takes 3x as long per row as a and c: its rows move to them
    record = sharing.step(1, {"a": 4.0, "b": 6.0, "c": 2.0})
    assert record is not None and record.applied and record.plan.before == (4, 2, 2)
    assert sharing.shares == record.plan.after and sharing.shares[1] < 2 and sum(sharing.shares) == 8
    assert sharing.history == [(4, 2, 2), sharing.shares]
    # balanced times: no move, the shares stay
    steady = ShareRebalancing(["a", "b", "c"], (4, 2, 2), RebalancePolicy(cooldown_steps=0))
    assert steady.step(1, {"a": 4.0, "b": 4.0, "c": 4.0}) is None
    assert steady.shares == (4, 2, 2) and steady.history == [(4, 2, 2), (4, 2, 2)] and not steady.records


def test_hand_made_plan_and_errors():
    sharing = ShareRebalancing(["a", "b"], (3, 3))
    plan = GroupSharePlan("microbatches", ("a", "b"), (3, 3), (2, 4), (ShareMove("a", "b", 1),), (0, 0), (0, 0), "x")
    sharing.apply(plan, 0)
    assert sharing.shares == (2, 4) and sharing.history == [(2, 4)]
    assert sharing.records[-1].note == "applied by hand"
    with pytest.raises(ValueError, match="plan starts from \\[3, 3\\], the current split is \\[2, 4\\]"):
        sharing.apply(plan, 1)
    other = GroupSharePlan("microbatches", ("a", "c"), (2, 4), (1, 5), (ShareMove("a", "c", 1),), (0, 0), (0, 0), "x")
    with pytest.raises(ValueError, match="plan.groups=\\['a', 'c'\\]: the dynamic groups are \\['a', 'b'\\]"):
        sharing.apply(other, 1)
    with pytest.raises(ValueError, match="at least two dynamic groups"):
        ShareRebalancing(["a"], (3,))


def test_for_processes_scales_the_rlhf_config_for_msrun():
    config = for_processes(load_parallel_config(CONFIGS / "rlhf_process_groups.yaml"), 4)
    assert [(g.name, g.ranks, g.hardware, g.scheduler) for g in config.groups] == [
        ("actor", (0, 1), "CPU", "static"), ("critic", (2,), "CPU", "static"), ("reward", (3,), "CPU", "static")]
    assert config.optimizer_sharding is None and config.mesh.size == 4
    kept = for_processes(load_parallel_config(CONFIGS / "rlhf_process_groups.yaml"), 4, scheduler=None)
    assert {g.scheduler for g in kept.groups} == {"dynamic"}
    with pytest.raises(ValueError, match="hardware='TPU'"):
        for_processes(config, 4, hardware="TPU")
    with pytest.raises(ValueError, match="scheduler='sometimes'"):
        for_processes(config, 4, scheduler="sometimes")
