"""Loss scaling in train_step(loss_scale=...): mindspore.amp's static and dynamic loss scalers (or a
number); the scaled step equals the plain one, an overflowing step is skipped and the scale adjusted."""
import math

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, amp, nn

from train_helpers import batch, parallel, twins

LR = 0.1
STEPS16 = 6


def trained(kind, loss_scale, steps=2):
    _, net = twins()
    par = parallel(net, kind)
    opt = nn.Momentum(par.optimizer_parameters(), LR, 0.9)
    losses = [float(par.train_step(opt, *batch(seed), loss_scale=loss_scale)) for seed in range(steps)]
    return par, losses, {p.name: p.asnumpy() for p in net.trainable_params()}


@pytest.mark.parametrize("loss_scale", [2.0 ** 10, amp.StaticLossScaler(2 ** 12)])
def test_static_scale_trains_like_no_scale(loss_scale):
    """A power-of-two scale is exact in float32 (no overflow, no underflow here): same losses,
    gradients and parameters as without scaling, and the gradients are kept unscaled."""
    plain, plain_losses, plain_params = trained("zero", None)
    scaled, losses, params = trained("zero", loss_scale)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    assert scaled.last_grad_norm == pytest.approx(plain.last_grad_norm, rel=1e-6)
    for name, want in plain_params.items():
        np.testing.assert_allclose(params[name], want, rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(scaled.last_gradients[name], plain.last_gradients[name], rtol=1e-5, atol=1e-7)
    assert not scaled.last_step_skipped


def test_dynamic_scale_skips_an_overflowing_step_and_lowers_the_scale():
    scaler = amp.DynamicLossScaler(2.0 ** 16, 2, 1)
    _, net = twins()
    par = parallel(net, "dxt")
    opt = nn.Momentum(par.optimizer_parameters(), LR, 0.9)
    start = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    x, y = batch(0)
    poisoned = x.asnumpy().copy()
    poisoned[13, 2] = np.inf  # one sample on the last data shard: every gradient becomes nan
    par.train_step(opt, Tensor(poisoned), y, loss_scale=scaler)
    assert par.last_step_skipped and not math.isfinite(par.last_grad_norm)
    for p in net.trainable_params():
        np.testing.assert_array_equal(p.asnumpy(), start[p.name], err_msg=f"{p.name} updated by a skipped step")
    assert float(scaler.scale_value.asnumpy()) == 2.0 ** 15  # divided by scale_factor
    loss = float(par.train_step(opt, x, y, loss_scale=scaler))  # finite: applied
    assert not par.last_step_skipped and math.isfinite(loss) and math.isfinite(par.last_grad_norm)
    assert all(not np.array_equal(p.asnumpy(), start[p.name]) for p in net.trainable_params())
    assert float(scaler.scale_value.asnumpy()) == 2.0 ** 16  # scale_window=1 finite step: raised again


def test_float16_model_follows_mindspore_loss_scaling_recipe():
    """Dense layers computing in float16 (`to_float`), a DynamicLossScaler from 2**20: the steps
    skipped, the scale after each step and the trained parameters equal MindSpore's own recipe on
    one device (scaler.scale(loss), value_and_grad, scaler.unscale, amp.all_finite,
    scaler.adjust, update if finite), up to float16 rounding in another order."""
    ref, net = twins()
    for model in (ref, net):
        model.fc1.to_float(ms.float16)
        model.fc2.to_float(ms.float16)
    start = [p.asnumpy().copy() for p in ref.trainable_params()]
    ref_scaler, scaler = amp.DynamicLossScaler(2.0 ** 20, 2, 2), amp.DynamicLossScaler(2.0 ** 20, 2, 2)
    ref_opt = nn.SGD(ref.trainable_params(), LR)
    step = ms.value_and_grad(lambda x, y: ref_scaler.scale(ref(x, y)), None, ref.trainable_params())
    par = parallel(net, "dxt")
    opt = nn.SGD(par.optimizer_parameters(), LR)
    u16 = 2.0 ** -11  # float16 unit roundoff
    rtol = 4 * STEPS16 * (32 * u16) / (1 - 32 * u16)  # tests/tolerances.training_rtol with float16's u
    skipped, ref_skipped, applied = [], [], 0
    for seed in range(STEPS16):
        x, y = batch(seed)
        loss = float(par.train_step(opt, x, y, loss_scale=scaler))
        ref_loss, grads = step(x, y)
        assert loss == pytest.approx(float(ref_loss) / float(ref_scaler.scale_value.asnumpy()), rel=rtol), seed
        grads = ref_scaler.unscale(grads)
        finite = amp.all_finite(grads)
        ref_scaler.adjust(finite)
        if finite:
            ref_opt(grads)
            applied += 1
        skipped.append(par.last_step_skipped)
        ref_skipped.append(not bool(finite))
        assert float(scaler.scale_value.asnumpy()) == float(ref_scaler.scale_value.asnumpy()), seed
    assert skipped == ref_skipped and any(skipped) and applied >= 2  # overflows at 2**20 and 2**19, then trains
    for p, before in zip(ref.trainable_params(), start):
        got, want = net.parameters_dict()[p.name].asnumpy(), p.asnumpy()
        assert np.linalg.norm(got - want) <= rtol * np.linalg.norm(want - before), p.name


def test_loss_scale_refuses_bad_values():
    _, net = twins()
    par = parallel(net, "dp")
    opt = nn.SGD(par.optimizer_parameters(), LR)
    for bad in (0.5, float("inf"), "1024", True):
        with pytest.raises(ValueError, match=r"loss_scale=.*expected None, a number >= 1, or a mindspore.amp loss "
                                             r"scaler"):
            par.train_step(opt, *batch(), loss_scale=bad)
