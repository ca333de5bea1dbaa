"""rebalance_experts against DeepSeek EPLB's published example; placements applied to the
expert-parallel layer leave its numbers unchanged."""
import numpy as np
import pytest
import mindspore as ms

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.moe.eplb import rebalance_experts
from mindspore_hyper.moe.expert_placement import ExpertPlacement, apply_placement, member_loads
from mindspore_hyper.moe import plan_dispatch
from mindspore_hyper.runtime.simulation import simulate

from moe_models import MoENet, batches, copy_weights, expert_strategy

pytestmark = pytest.mark.usefixtures("pynative")

# github.com/deepseek-ai/EPLB README: 2 layers x 12 experts, 16 replicas, 4 groups, 2 nodes, 8 GPUs
README_WEIGHT = np.array([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                          [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]])
README_PHY2LOG = np.array([[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                           [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]])


def _consistent(phy2log, log2phy, logcnt):
    layers, experts, _ = log2phy.shape
    for layer in range(layers):
        assert np.bincount(phy2log[layer], minlength=experts).tolist() == logcnt[layer].tolist()
        for e in range(experts):
            slots = log2phy[layer, e, :logcnt[layer, e]]
            assert (phy2log[layer, slots] == e).all() and (log2phy[layer, e, logcnt[layer, e]:] == -1).all()


def test_readme_example_hierarchical():
    phy2log, log2phy, logcnt = rebalance_experts(README_WEIGHT, 16, 4, 2, 8)
    np.testing.assert_array_equal(phy2log, README_PHY2LOG)
    assert log2phy.shape == (2, 12, 2) and logcnt.sum(1).tolist() == [16, 16]
    _consistent(phy2log, log2phy, logcnt)
    # hierarchical: each node (8 slots) holds whole expert groups (3 experts each)
    for layer in range(2):
        for node in range(2):
            groups = {e // 3 for e in phy2log[layer, node * 8:(node + 1) * 8]}
            assert len(groups) == 2


def test_global_policy_when_groups_do_not_divide_nodes():
    weight = np.random.default_rng(0).random((1, 12)) * 100
    phy2log, log2phy, logcnt = rebalance_experts(weight, 16, 3, 2, 8)  # 3 groups, 2 nodes
    _consistent(phy2log, log2phy, logcnt)
    same = rebalance_experts(weight, 16, 1, 1, 8)  # the global policy
    np.testing.assert_array_equal(phy2log, same[0])
    # the 4 redundant replicas go to the hottest experts
    hottest = np.argsort(-weight[0])[:2]
    assert all(logcnt[0, e] >= 2 for e in hottest)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="num_replicas=10 must be >= 12 experts"):
        rebalance_experts(README_WEIGHT, 10, 4, 2, 8)
    with pytest.raises(ValueError, match="num_gpus=7 must be a positive multiple of num_nodes=2"):
        rebalance_experts(README_WEIGHT, 14, 4, 2, 7)
    with pytest.raises(ValueError, match="num_groups=5 must divide the 12 experts"):
        rebalance_experts(README_WEIGHT, 16, 5, 2, 8)
    with pytest.raises(ValueError, match=r"weight must be \[layers, experts\]"):
        rebalance_experts(np.ones(12), 16, 4, 2, 8)


def test_physical_plan_splits_tokens_among_replicas():
    placement = ExpertPlacement(np.array([0, 1, 0, 2]), 3)
    plan = plan_dispatch(np.array([[0], [0], [1], [0], [2]]), 3)
    phys = placement.physical_plan(plan)
    assert [t.tolist() for t in phys.tokens] == [[0, 3], [2], [1], [4]]
    assert member_loads(plan.counts, placement, 2).tolist() == [3, 2]
    with pytest.raises(ValueError, match=r"experts \[2\] have no slot"):
        ExpertPlacement(np.array([0, 1, 0, 1]), 3)


def test_placement_keeps_numerics_and_balances_load(clean_context):
    mh.set_context(device_num=4)
    ms.set_seed(0)
    ref, par = MoENet(), MoENet()
    copy_weights(ref, par)
    sim = simulate(par, expert_strategy(Layout((2, 2), ("data", "expert"))))
    x, t = batches(1)[0]
    sim(x, t)
    counts = par.moe.last_expert_counts
    phy2log, _, _ = rebalance_experts(counts[None, :], 12, 1, 1, 2)  # 4 redundant slots over expert=2
    placement = ExpertPlacement.from_eplb(phy2log)
    apply_placement(par.moe, placement)
    before = member_loads(counts, ExpertPlacement(np.arange(8), 8), 2)
    after = member_loads(counts, placement, 2)
    assert after.max() <= before.max()
    ref_loss, ref_grads = ms.value_and_grad(ref, None, ref.trainable_params())(x, t)
    loss, grads = ms.value_and_grad(sim, None, par.trainable_params())(x, t)
    assert abs(float(loss.asnumpy()) - float(ref_loss.asnumpy())) < 1e-6
    for p, a, b in zip(ref.trainable_params(), ref_grads, grads):  # replica gradients summed into their expert
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-4, atol=1e-7, err_msg=p.name)
    with pytest.raises(ValueError, match="placement for 3 experts, the layer has 8"):
        apply_placement(par.moe, ExpertPlacement(np.array([0, 1, 2, 0]), 3))
