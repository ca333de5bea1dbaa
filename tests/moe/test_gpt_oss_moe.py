"""gpt-oss's MoE in `MoE` (router_bias, scoring="topk_softmax", expert_bias, activation="clamped_swiglu"): one
device equals a numpy transcription of transformers' GptOssMLP (router logits with a bias, the top-k logits'
softmax as weights, biased experts with the clamped SwiGLU (up + 1) * gate * sigmoid(alpha * gate)), and under
expert parallelism in simulation (data x expert, expert x tensor with F split: b_down added once) forward,
gradients and Adam steps equal one device."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.moe import MoE
from mindspore_hyper.runtime.simulation import simulate

from moe_models import (GPT_OSS, MoENet, assert_computes_like_one_device, assert_trains_like_one_device, batches,
                        copy_weights, dry_run_and_balanced_simulation, expert_strategy, randomise_biases)

pytestmark = pytest.mark.usefixtures("pynative")


def numpy_gpt_oss(x, moe):
    """GptOssMLP in float64 numpy: x [T, H] -> [T, H]."""
    w = moe.router.weight.asnumpy().astype(np.float64)
    logits = x @ w + moe.router.bias.asnumpy()
    k = moe.top_k
    chosen = np.argsort(-logits, axis=-1)[:, :k]
    top = np.take_along_axis(logits, chosen, axis=1)
    weights = np.exp(top - top.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    e = moe.experts
    wg, wu, wd = (p.asnumpy().astype(np.float64) for p in (e.w_gate, e.w_up, e.w_down))
    bg, bu, bd = (p.asnumpy().astype(np.float64) for p in e.biases())
    alpha, limit = e.clamp
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            ex = chosen[t, j]
            g = np.minimum(x[t] @ wg[ex] + bg[ex], limit)
            u = np.clip(x[t] @ wu[ex] + bu[ex], -limit, limit)
            h = (u + 1) * g / (1 + np.exp(-alpha * g))
            out[t] += weights[t, j] * (h @ wd[ex] + bd[ex])
    return out


def test_one_device_equals_gpt_oss():
    ms.set_seed(0)
    moe = MoE(16, 12, 8, top_k=2, aux_loss_coef=0.0, **GPT_OSS)
    randomise_biases(moe)
    x = np.random.default_rng(1).normal(size=(24, 16)).astype(np.float32)
    y, _ = moe(Tensor(x))
    want = numpy_gpt_oss(x.astype(np.float64), moe)
    assert np.abs(want).max() > 0.1
    # float32: 16- and 12-term products, a clamp, a sigmoid, a 2-term softmax: 1e-5 relative to the largest output
    np.testing.assert_allclose(y.asnumpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    routing = moe.router(Tensor(x))
    np.testing.assert_allclose(routing.gates.asnumpy().sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("matrix, names, tensor", [((2, 2), ("data", "expert"), False),
                                                   ((2, 2), ("expert", "tensor"), True)])
def test_expert_parallel_gpt_oss_equals_one_device(matrix, names, tensor):
    mh.set_context(device_num=4)
    ms.set_seed(0)
    ref, par = MoENet(shared=8, **GPT_OSS), MoENet(shared=8, **GPT_OSS)
    randomise_biases(ref)
    copy_weights(ref, par)
    sim = simulate(par, expert_strategy(Layout(matrix, names), tensor))
    data = batches(3)
    x, t = data[0]
    checked = assert_computes_like_one_device(ref, par, sim, x, t)
    assert {"moe.router.bias", "moe.experts.b_gate", "moe.experts.b_down"} <= set(checked)
    assert_trains_like_one_device(ref, par, sim, data)


@pytest.mark.parametrize("options, message", [
    (dict(activation="gelu"), "activation='gelu'; expected one of"),
    (dict(activation="clamped_swiglu", swiglu_limit=0), "limit=0 a number > 0"),
    (dict(expert_bias=1), "bias=1 must be a bool"),
    (dict(router_bias="yes"), "bias='yes' must be a bool"),
])
def test_bad_expert_options_are_refused_naming_them(options, message):
    with pytest.raises(ValueError, match=message):
        MoE(16, 8, 8, top_k=2, **options)


def test_a_biased_layer_laid_out_otherwise_is_refused_naming_the_bias():
    mh.set_context(device_num=4)
    strategy = expert_strategy(Layout((2, 2), ("expert", "tensor")), True)
    strategy.override("*.experts.b_down", "expert", "tensor")
    sim = simulate(MoENet(shared=8, **GPT_OSS), strategy)
    with pytest.raises(ValueError, match=r"experts.b_down is laid out as"):
        sim(*batches(1)[0])


def test_a_dry_run_of_gpt_oss_experts_equals_the_balanced_simulation():
    """The dry run routes balanced (no logits) and runs the clamped, biased experts on shapes: its report equals
    the simulation's with moe_routing="balanced", memory and collectives."""
    sim, dry = dry_run_and_balanced_simulation(mh, lambda: MoENet(shared=8, **GPT_OSS), expert_strategy(Layout((2, 2), ("expert", "tensor")), True))
    assert sim.memory == dry.memory and sim.comm == dry.comm and sim.comm_backward == dry.comm_backward
    assert "expert" in dry.comm["AllToAll"]


def test_replicated_experts_keep_their_biases_numerics():
    """EPLB replicas of biased experts (data 2 x expert 2, 4 redundant slots): every replica reads its expert's
    biases, and their gradients add up in the expert's, as one device computes them."""
    from mindspore_hyper.moe.eplb import rebalance_experts
    from mindspore_hyper.moe.expert_placement import ExpertPlacement, apply_placement

    mh.set_context(device_num=4)
    ms.set_seed(0)
    ref, par = MoENet(**GPT_OSS), MoENet(**GPT_OSS)
    randomise_biases(ref)
    copy_weights(ref, par)
    sim = simulate(par, expert_strategy(Layout((2, 2), ("data", "expert"))))
    x, t = batches(1)[0]
    sim(x, t)
    phy2log, _, _ = rebalance_experts(par.moe.last_expert_counts[None, :], 12, 1, 1, 2)
    apply_placement(par.moe, ExpertPlacement.from_eplb(phy2log))
    assert_computes_like_one_device(ref, par, sim, x, t)
