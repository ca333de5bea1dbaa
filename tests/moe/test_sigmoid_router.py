"""DeepSeek-V3's routing in `TopKRouter` / `MoE` (scoring="sigmoid", score_bias, group_score="top2_sum",
routed_scaling_factor): the choice and weights equal a numpy transcription of DeepSeek-V3's router (transformers'
DeepseekV3TopkRouter), the bias moves the choice but not the weights and is not trained, and under expert
parallelism in simulation the layer computes, differentiates and trains like one device."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.moe import MoE
from mindspore_hyper.moe.router import TopKRouter, route_tokens
from mindspore_hyper.runtime.simulation import simulate

from moe_models import (DEEPSEEK, MoENet, assert_computes_like_one_device, assert_trains_like_one_device, batches,
                        copy_weights, dry_run_and_balanced_simulation, expert_strategy)

pytestmark = pytest.mark.usefixtures("pynative")


def numpy_deepseek_v3(x, w, bias, top_k, groups, topk_groups, normalize, scale):
    """DeepSeek-V3's router in float64 numpy: ([T, k] experts as sets, [T, E] weights, zero off the chosen)."""
    scores = 1.0 / (1.0 + np.exp(-(x.astype(np.float64) @ w.astype(np.float64))))
    choice = scores + bias
    tokens, experts = choice.shape
    grouped = choice.reshape(tokens, groups, experts // groups)
    group_score = np.sort(grouped, axis=-1)[..., -2:].sum(-1)
    kept = np.argsort(-group_score, axis=-1)[:, :topk_groups]
    mask = np.full((tokens, groups), -np.inf)
    np.put_along_axis(mask, kept, 0.0, axis=1)
    choice = choice + np.repeat(mask, experts // groups, axis=1)
    chosen = np.argsort(-choice, axis=-1)[:, :top_k]
    top = np.take_along_axis(scores, chosen, axis=1)
    if normalize:
        top = top / (top.sum(-1, keepdims=True) + 1e-20)
    weights = np.zeros_like(scores)
    np.put_along_axis(weights, chosen, top * scale, axis=1)
    return chosen, weights


@pytest.mark.parametrize("normalize", [True, False])
def test_choice_and_weights_equal_deepseek_v3(normalize):
    rng = np.random.default_rng(3)
    x, w = rng.normal(size=(64, 16)).astype(np.float32), rng.normal(size=(16, 8)).astype(np.float32)
    bias = (0.3 * rng.normal(size=8)).astype(np.float32)
    routing = route_tokens(Tensor(x), Tensor(w), 3, normalize, None, 4, 2, "sigmoid", Tensor(bias), "top2_sum", 2.5)
    chosen, want = numpy_deepseek_v3(x, w, bias, 3, 4, 2, normalize, 2.5)
    assert [set(r) for r in routing.experts.tolist()] == [set(r) for r in chosen.tolist()]
    got = np.zeros((64, 8))
    np.put_along_axis(got, routing.experts, routing.gates.asnumpy().astype(np.float64), axis=1)
    # float32 sigmoid of a 16-term float32 dot product, a 3-term sum, one division, one product: within 1e-5
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    probs = routing.probs.asnumpy()  # what the balance loss averages: the scores normalised per token
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)


def test_the_bias_moves_the_choice_not_the_weights_and_is_not_trained():
    router = TopKRouter(16, 8, 2, scoring="sigmoid", score_bias=True)
    x = Tensor(np.random.default_rng(0).normal(size=(32, 16)).astype(np.float32))
    before = router(x)
    bias = np.zeros(8, np.float32)
    bias[7] = 10.0  # expert 7 wins every token's choice
    router.score_bias.set_data(Tensor(bias))
    after = router(x)
    assert (after.experts == 7).any(-1).all() and not (before.experts == 7).all()
    scores = 1.0 / (1.0 + np.exp(-after.logits.asnumpy().astype(np.float64)))
    top = np.take_along_axis(scores, after.experts, axis=1)
    np.testing.assert_allclose(after.gates.asnumpy(), top / top.sum(-1, keepdims=True), rtol=1e-5)  # unbiased
    assert [p.name for p in router.trainable_params()] == ["weight"]
    assert "score_bias" in [n for n, _ in router.parameters_and_names()]


@pytest.mark.parametrize("options, message", [
    (dict(scoring="relu"), "scoring='relu'; expected one of"),
    (dict(group_score="mean"), "group_score='mean'; expected one of"),
    (dict(routed_scaling_factor=0), "routed_scaling_factor=0 must be a number > 0"),
    (dict(routed_scaling_factor=True), "routed_scaling_factor=True must be a number > 0"),
    (dict(score_bias=1), "score_bias=1 must be a bool"),
    (dict(group_score="top2_sum", num_groups=8, topk_groups=2), "needs groups of at least 2 experts"),
])
def test_bad_routing_options_are_refused_naming_them(options, message):
    with pytest.raises(ValueError, match=message):
        MoE(16, 8, 8, top_k=2, **options)


def test_expert_parallel_deepseek_routing_equals_one_device():
    """data 2 x expert 2: forward, every gradient and 3 Adam steps equal one device; the bias (set so that it
    changes the choice) is laid out, read by every device's routing, and left as it was."""
    mh.set_context(device_num=4)
    ms.set_seed(0)
    ref, par = MoENet(shared=8, **DEEPSEEK), MoENet(shared=8, **DEEPSEEK)
    bias = (0.3 * np.random.default_rng(5).normal(size=8)).astype(np.float32)
    ref.moe.router.score_bias.set_data(Tensor(bias))
    copy_weights(ref, par)
    sim = simulate(par, expert_strategy(Layout((2, 2), ("data", "expert"))))
    data = batches(3)
    x, t = data[0]
    assert_computes_like_one_device(ref, par, sim, x, t)
    unbiased = MoENet(shared=8, **DEEPSEEK)
    copy_weights(ref, unbiased)
    unbiased.moe.router.score_bias.set_data(Tensor(np.zeros(8, np.float32)))
    h = ref.inp(x).reshape(-1, 16)
    assert (ref.moe.router(h).experts != unbiased.moe.router(h).experts).any()  # the bias mattered
    assert_trains_like_one_device(ref, par, sim, data)
    np.testing.assert_array_equal(par.moe.router.score_bias.asnumpy(), bias)


def test_a_dry_run_of_deepseek_routing_equals_the_balanced_simulation():
    """The dry run has no scores to rank (balanced routing, the bias never read): its report equals the
    simulation's with moe_routing="balanced", memory and collectives."""
    sim, dry = dry_run_and_balanced_simulation(mh, lambda: MoENet(shared=8, **DEEPSEEK), expert_strategy(Layout((2, 2), ("data", "expert"))))
    assert sim.memory == dry.memory and sim.comm == dry.comm and sim.comm_backward == dry.comm_backward
    assert "expert" in dry.comm["AllToAll"]
