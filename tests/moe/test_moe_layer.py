"""The MoE layer on one device against a numpy reference; router losses; dispatch plans."""
import math

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindspore_hyper.moe import MoE, DispatchStates, load_balancing_loss, plan_dispatch, expert_capacity, z_loss

pytestmark = pytest.mark.usefixtures("pynative")


def numpy_moe(x, moe, capacity_factor):
    """Reference forward of `moe` on x [T, H] in numpy (float64)."""
    wr = moe.router.weight.asnumpy().astype(np.float64)
    wg, wu, wd = (p.asnumpy().astype(np.float64) for p in (moe.experts.w_gate, moe.experts.w_up, moe.experts.w_down))
    t, e, k = x.shape[0], moe.num_experts, moe.top_k
    logits = x @ wr
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    gates = np.take_along_axis(probs, chosen, 1)
    if k > 1:
        gates = gates / gates.sum(-1, keepdims=True)
    cap = math.ceil(capacity_factor * t * k / e) if capacity_factor else t * k
    used = np.zeros(e, int)
    y = np.zeros_like(x)
    for slot in range(k):
        for i in range(t):
            ex = chosen[i, slot]
            if used[ex] >= cap:
                continue
            used[ex] += 1
            g = x[i] @ wg[ex]
            y[i] += gates[i, slot] * ((g / (1 + np.exp(-g)) * (x[i] @ wu[ex])) @ wd[ex])
    if moe.shared is not None:
        s = moe.shared
        g = x @ s.gate.weight.asnumpy().T
        shared = (g / (1 + np.exp(-g)) * (x @ s.up.weight.asnumpy().T)) @ s.down.weight.asnumpy().T
        if s.gate_score is not None:  # Qwen2-MoE's sigmoid gate, one scalar per token
            shared = shared / (1 + np.exp(-(x @ s.gate_score.weight.asnumpy().T)))
        y += shared
    counts = np.bincount(chosen.ravel(), minlength=e)
    aux = moe.aux_loss_coef * e * np.sum(counts / (t * k) * probs.mean(0))
    lse = np.log(np.exp(logits).sum(-1))
    aux += moe.z_loss_coef * np.mean(lse ** 2)
    return y, aux, used


@pytest.mark.parametrize("top_k,capacity_factor,shared,gated", [(2, None, 0, False), (1, None, 8, False),
                                                                 (2, 0.5, 0, False), (3, 1.0, 8, False),
                                                                 (2, None, 8, True)])
def test_forward_matches_numpy(top_k, capacity_factor, shared, gated):
    ms.set_seed(0)
    moe = MoE(16, 24, num_experts=6, top_k=top_k, capacity_factor=capacity_factor, aux_loss_coef=0.1,
              z_loss_coef=1e-3, shared_ffn_hidden=shared, shared_expert_gate=gated)
    x = np.random.default_rng(1).normal(size=(2, 10, 16)).astype(np.float32)
    y, aux = moe(Tensor(x))
    ref_y, ref_aux, used = numpy_moe(x.reshape(20, 16).astype(np.float64), moe, capacity_factor)
    np.testing.assert_allclose(y.asnumpy().reshape(20, 16), ref_y, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(aux.asnumpy()), ref_aux, rtol=1e-5)
    if capacity_factor == 0.5:
        assert used.sum() < 20 * top_k  # some copies really were dropped


def test_perfectly_balanced_aux_equals_coefficient():
    # 4 token classes, one per expert, router = scaled identity: every expert gets exactly a
    # quarter of the tokens and, by symmetry, a quarter of the probability mass.
    moe = MoE(4, 8, num_experts=4, top_k=1, aux_loss_coef=0.25)
    moe.router.weight.set_data(Tensor(3.0 * np.eye(4, dtype=np.float32)))
    x = np.tile(np.eye(4, dtype=np.float32), (5, 1))
    _, aux = moe(Tensor(x))
    assert abs(float(aux.asnumpy()) - 0.25) < 1e-6
    assert moe.last_expert_counts.tolist() == [5, 5, 5, 5]
    # and the formula on balanced sums directly (top-2 over 8 experts, 64 tokens)
    lb = load_balancing_loss(Tensor(np.full(8, 8.0, np.float32)), Tensor(np.full(8, 16.0, np.float32)), 64, 2, 0.01)
    assert abs(float(lb.asnumpy()) - 0.01) < 1e-9


def test_imbalanced_aux_exceeds_coefficient_and_z_loss():
    probs = np.full(4, 10.0, np.float32)  # P uniform but all copies to expert 0: f·P = 1/4
    lb = load_balancing_loss(Tensor(probs * 0 + 10.0), Tensor(np.array([40.0, 0, 0, 0], np.float32)), 40, 1, 1.0)
    assert abs(float(lb.asnumpy()) - 1.0) < 1e-6
    lb = load_balancing_loss(Tensor(np.array([40.0, 0, 0, 0], np.float32)), Tensor(np.array([40.0, 0, 0, 0], np.float32)),
                             40, 1, 1.0)
    assert abs(float(lb.asnumpy()) - 4.0) < 1e-6  # fully collapsed routing: E * coef
    logits = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    ref = 0.1 * np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
    assert abs(float(z_loss(Tensor(logits), 0.1).asnumpy()) - ref) < 1e-6


@pytest.mark.parametrize("options, message", [({"shared_expert_gate": True}, "True only with a shared expert"),
                                              ({"shared_ffn_hidden": 4, "shared_expert_gate": 1}, "must be a bool")])
def test_a_shared_expert_gate_needs_a_shared_expert(options, message):
    with pytest.raises(ValueError, match=f"MoE: shared_expert_gate=.*{message}"):
        MoE(8, 12, num_experts=4, **options)


def test_gradients_reach_every_parameter():
    ms.set_seed(2)
    moe = MoE(8, 12, num_experts=4, top_k=2, shared_ffn_hidden=4, shared_expert_gate=True)
    x = Tensor(np.random.default_rng(3).normal(size=(12, 8)).astype(np.float32))

    def loss_fn(x):
        y, aux = moe(x)
        return (y * y).mean() + aux

    _, grads = ms.value_and_grad(loss_fn, None, moe.trainable_params())(x)
    for p, g in zip(moe.trainable_params(), grads):
        assert np.abs(g.asnumpy()).sum() > 0, p.name


def test_router_noise_only_in_training():
    moe = MoE(8, 8, num_experts=8, top_k=1, noise_std=5.0)
    x = Tensor(np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32))
    moe.set_train(False)
    moe(x)
    clean = moe.last_expert_counts.copy()
    moe(x)
    assert moe.last_expert_counts.tolist() == clean.tolist()
    moe.set_train(True)
    moe(x)
    assert moe.last_expert_counts.tolist() != clean.tolist()


def test_plan_capacity_priority_and_mask():
    experts = np.array([[0, 1], [0, 2], [0, 1], [1, 0]])
    plan = plan_dispatch(experts, 3, capacity=2)
    plan.validate()
    # expert 0: first choices of tokens 0 and 1 fill it; token 2's first choice and token 3's second are dropped
    assert plan.tokens[0].tolist() == [0, 1]
    assert plan.tokens[1].tolist() == [0, 3]  # token 3's first choice before token 0's second
    assert plan.slots[1].tolist() == [1, 0]
    assert plan.dropped == 3
    assert plan.choice_counts.tolist() == [4, 3, 1]
    assert plan.mask().sum() == plan.counts.sum()
    assert expert_capacity(10, 4, 2, 1.0) == 5 and expert_capacity(10, 4, 2, None) is None


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="top_k=5 must be between 1 and num_experts=4"):
        MoE(8, 8, num_experts=4, top_k=5)
    with pytest.raises(ValueError, match="capacity_factor=0 must be > 0"):
        MoE(8, 8, num_experts=4, capacity_factor=0)
    with pytest.raises(ValueError, match="expected hidden=8"):
        MoE(8, 8, num_experts=4)(Tensor(np.zeros((2, 6), np.float32)))
    with pytest.raises(ValueError, match="chooses the same expert twice"):
        plan_dispatch(np.array([[1, 1]]), 3)
    with pytest.raises(ValueError, match="expert ids must be in 0..2"):
        plan_dispatch(np.array([[3]]), 3)


def test_dispatch_states_are_keyed_by_microbatch():
    states = DispatchStates()
    states.put(0, "a")
    states.put(1, "b")
    with pytest.raises(RuntimeError, match="microbatch 0 dispatched again before its combine"):
        states.put(0, "c")
    assert states.pop(0) == "a" and states.pop(1) == "b"
    with pytest.raises(RuntimeError, match="combine of microbatch 1 without a dispatch"):
        states.pop(1)
