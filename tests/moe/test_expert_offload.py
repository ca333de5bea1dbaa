"""hyper_offload of a model with an MoE layer: the experts live in the hot-expert cache, a step
brings only the routed ones, and training equals the non-offloaded model exactly."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import nn

from mindspore_hyper import set_context
from mindspore_hyper.offload.expert_cache import ExpertCacheConfig
from mindspore_hyper.offload import OffloadPolicy, hyper_offload, maybe_offload

from moe_models import MoENet, batches, copy_weights

EXPERTS = 8


def _reference_losses(model, data, steps, opt):
    optimizer = opt(model.trainable_params())
    grad_fn = ms.value_and_grad(lambda x, t: model(x, t), None, optimizer.parameters)
    losses = []
    for x, t in data[:steps]:
        loss, grads = grad_fn(x, t)
        optimizer(grads)
        losses.append(float(loss.asnumpy()))
    return losses, {p.name: p.asnumpy() for p in model.trainable_params()}


def _pair(seed=0, **kw):
    ms.set_seed(seed)
    ref = MoENet(experts=EXPERTS, **kw)
    off = MoENet(experts=EXPERTS, **kw)
    copy_weights(ref, off)
    return ref, off


def _small_batches(steps):
    # 2 x 2 tokens, top-2: at most 8 experts a step; 4 tokens usually route to fewer
    return batches(steps, batch=2, seq=2)


@pytest.mark.parametrize("opt_name", ["adam", "sgd"])
def test_training_equals_the_non_offloaded_moe(opt_name):
    opt = (lambda ps: nn.Adam(ps, learning_rate=1e-2)) if opt_name == "adam" else \
        (lambda ps: nn.SGD(ps, learning_rate=0.1, momentum=0.9))
    ref, model = _pair()
    data = _small_batches(5)
    ref_losses, ref_params = _reference_losses(ref, data, 5, opt)
    policy = OffloadPolicy(cells=["inp"], expert_cache=ExpertCacheConfig(policy="routing", capacity=EXPERTS))
    off = hyper_offload(model, policy, optimizer=opt, block_size=1 << 16, device_memory=1 << 20, host_memory=1 << 22)
    try:
        step = off.train_step(lambda x, t: model(x, t))
        losses = [float(step(x, t).asnumpy()) for x, t in data]
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
        # a forward outside a step (evaluation) brings the experts too, and gives the reference's loss
        x, t = data[0]
        np.testing.assert_allclose(float(model(x, t).asnumpy()), float(ref(x, t).asnumpy()), rtol=1e-5, atol=1e-6)
        values = off.parameter_values()
        assert set(values) == set(ref_params)
        for name, value in ref_params.items():
            np.testing.assert_allclose(values[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
        stats = off.stats()["expert_cache"][0]
        assert stats["layer"] == "moe" and len(stats["cold_per_step"]) == 5
        assert stats["cold_per_step"][0] > 0  # nothing resident before the first step
        # the Parameters hold a placeholder between steps: the values live in the store
        assert model.moe.experts.w_gate.shape == (1,)
    finally:
        off.remove()
        off.close()
    # remove() put the trained values back into the model
    np.testing.assert_allclose(model.moe.experts.w_up.asnumpy(), ref_params[model.moe.experts.w_up.name],
                               rtol=1e-5, atol=1e-6)


def test_a_step_brings_only_the_routed_experts_and_cold_ones_are_counted():
    ref, model = _pair(seed=1)
    data = batches(4, batch=1, seq=2)  # 2 tokens, top-2: at most 4 experts a step, 4 fit
    opt = lambda ps: nn.SGD(ps, learning_rate=0.05)  # noqa: E731
    ref_losses, ref_params = _reference_losses(ref, data, 4, opt)
    off = hyper_offload(model, OffloadPolicy(cells=["out"], expert_cache=ExpertCacheConfig(capacity=4)),
                        optimizer=opt, block_size=1 << 16, device_memory=1 << 20, host_memory=1 << 22)
    try:
        grad_fn = off.value_and_grad(lambda x, t: model(x, t))
        offload = off.expert_offloads[0]
        losses, cold_total = [], 0
        for x, t in data:
            resident_before = {e for e in range(EXPERTS) if offload.cache.resident(e)}
            loss, grads = grad_fn(x, t)
            used = list(offload.used)
            counts = model.moe.last_expert_counts
            assert used == [e for e in range(EXPERTS) if counts[e] > 0]
            assert model.moe.experts.w_gate.shape[0] == len(used)  # only the routed experts' rows
            cold = len([e for e in used if e not in resident_before])
            assert offload.cold_per_step[-1] == cold
            cold_total += cold
            off.apply_gradients(grads)
            losses.append(float(loss.asnumpy()))
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
        assert offload.cache.cold_fetches == cold_total
        assert sum(offload.cache.resident(e) for e in range(EXPERTS)) <= 4
        values = off.parameter_values()
        for name, value in ref_params.items():
            np.testing.assert_allclose(values[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    finally:
        off.close()


def test_flags_select_the_cache_and_bad_configs_are_refused():
    set_context(hyper_offload=True, moe_cache_policy="lru", moe_cache_capacity=5)
    _, model = _pair()
    off = maybe_offload(model, OffloadPolicy(cells=["inp"]), optimizer=lambda ps: nn.SGD(ps, 0.1),
                        block_size=1 << 16, device_memory=1 << 20, host_memory=1 << 22)
    try:
        cache = off.expert_offloads[0].cache
        assert (cache.policy, cache.capacity) == ("lru", 5)
    finally:
        off.remove()
        off.close()
    with pytest.raises(ValueError, match="moe_cache_policy='mru'"):
        set_context(moe_cache_policy="mru")
    with pytest.raises(ValueError, match="moe_cache_capacity=-1"):
        set_context(moe_cache_capacity=-1)
    with pytest.raises(ValueError, match="expert_cache.policy='fifo'"):
        ExpertCacheConfig(policy="fifo")
    with pytest.raises(ValueError, match=r"expert_cache.capacity=0: expected an int >= 1"):
        ExpertCacheConfig(capacity=0)
    with pytest.raises(ValueError, match=r"expert_cache.decay=1.0"):
        ExpertCacheConfig(decay=1.0)
    with pytest.raises(ValueError, match="OffloadPolicy.expert_cache="):
        OffloadPolicy(expert_cache={"policy": "lru"})
    _, model = _pair()
    before = model.moe.experts.w_gate.asnumpy()
    with pytest.raises(ValueError, match="capacity=9 for MoE layer 'moe': expected at most its 8 experts"):
        hyper_offload(model, OffloadPolicy(expert_cache=ExpertCacheConfig(capacity=9)),
                      optimizer=lambda ps: nn.SGD(ps, 0.1))
    np.testing.assert_array_equal(model.moe.experts.w_gate.asnumpy(), before)  # left as it was


def test_a_step_routing_to_more_experts_than_fit_is_refused():
    _, model = _pair()
    off = hyper_offload(model, OffloadPolicy(cells=["inp"], expert_cache=ExpertCacheConfig(capacity=2)),
                        optimizer=lambda ps: nn.SGD(ps, 0.1), block_size=1 << 16, device_memory=1 << 20,
                        host_memory=1 << 22)
    try:
        x, t = batches(1, batch=8, seq=4)[0]  # 32 tokens, top-2: more than 2 experts
        with pytest.raises(ValueError, match="routes tokens to [3-8] experts but the expert cache's device tier holds "
                                             "capacity=2"):
            off.train_step(lambda a, b: model(a, b))(x, t)
        assert not off.expert_offloads[0].cache.pinned  # released after the failure
    finally:
        off.close()


def test_biased_clamped_experts_are_refused_by_name_and_left_as_they_were():
    """gpt-oss's experts (biases, clamped SwiGLU) are not held by the expert cache: refused naming the layer,
    the model untouched."""
    from moe_models import GPT_OSS

    _, model = _pair(**GPT_OSS)
    before = model.moe.experts.b_down.asnumpy()
    with pytest.raises(NotImplementedError, match="expert_cache for MoE layer 'moe': its experts have biases"):
        hyper_offload(model, OffloadPolicy(expert_cache=ExpertCacheConfig(capacity=4)),
                      optimizer=lambda ps: nn.SGD(ps, 0.1))
    np.testing.assert_array_equal(model.moe.experts.b_down.asnumpy(), before)
    assert model.moe.expert_offload is None
