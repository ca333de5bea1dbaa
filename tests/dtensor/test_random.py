"""Random ops on DTensors give every device its part of the single device's draw (dtensor/random.py).

Dropout masks are compared exactly (the zero pattern, and the kept values scaled bitwise where no
reduction precedes them); values after split reductions within the float32 bounds of
tests/tolerances.py.
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.dtensor.dispatch import DTensorOpError
from mindspore_hyper.runtime.simulation import simulate
from mindspore_hyper.shard import Layout

from tolerances import assert_within, gradient_tolerance, reduction_length, training_rtol

RNG = np.random.default_rng(7)
X = Tensor(RNG.standard_normal((8, 4, 16)).astype(np.float32))  # (batch, sequence, hidden)


class DropNet(nn.Cell):
    """Dense layers of MindSpore's nn, dropout after each (nn.Dropout, then ops.dropout); returns
    the dropped hidden state and the output."""

    def __init__(self, p: float, functional_p: float):
        super().__init__()
        self.fc1 = nn.Dense(16, 32)
        self.drop = nn.Dropout(p=p)
        self.fc2 = nn.Dense(32, 16)
        self.functional_p = functional_p

    def construct(self, x):
        h = self.drop(ops.gelu(self.fc1(x)))
        return h, ops.dropout(self.fc2(h), self.functional_p)


def _build(p, functional_p):
    ms.set_seed(11)  # the weights and both dropouts' seeds
    net = DropNet(p, functional_p)
    net.set_train()
    return net


def _strategy(kind):
    if kind == "data":
        return Layout((4,), ("data",))(tensor_map=())
    if kind == "tensor":  # column-parallel fc1 (dropout on a split hidden), row-parallel fc2 (Partial)
        s = Layout((2, 2), ("data", "tensor"))(tensor_map=())
        s.override("fc1.*", "tensor")
        s.override("fc2.weight", None, "tensor")
        return s
    if kind == "sequence":  # batch over data, sequence over seq: every activation split along both
        return Layout((2, 2), ("data", "seq"))(tensor_map=(), input_map=("data", "seq"))
    raise ValueError(kind)


def _value_and_grads(net, x):
    def loss(inp):
        h, out = net(inp)
        return (out * out).sum() + h.sum()

    grad_fn = ms.value_and_grad(loss, None, net.trainable_params())
    ms.set_seed(5)  # ops.dropout takes its seeds from the global seed's counter: both runs restart it
    (value, grads), (h, out) = grad_fn(x), net(x)
    return value, grads, h, out


@pytest.mark.parametrize("kind,p", [("data", 0.1), ("tensor", 0.3), ("sequence", 0.5)])
def test_dropout_masks_and_gradients_equal_single_device(clean_context, kind, p):
    clean_context.set_context(device_num=4)
    ref, par = _build(p, 0.2), _build(p, 0.2)
    sim = simulate(par, _strategy(kind))
    ref_value, ref_grads, ref_h, ref_out = _value_and_grads(ref, X)
    value, grads, h, out = _value_and_grads(sim, X)
    h, ref_h, out, ref_out = h.asnumpy(), ref_h.asnumpy(), out.asnumpy(), ref_out.asnumpy()
    # the masks: the same elements dropped, in both dropouts (a per-shard draw drops others)
    np.testing.assert_array_equal(h == 0, ref_h == 0)
    np.testing.assert_array_equal(out == 0, ref_out == 0)
    assert 0 < (h == 0).mean() < 1 and 0 < (out == 0).mean() < 1
    # values: float32 reductions (fan-in 32 at most, split over devices) in another order
    rtol = training_rtol(32, 1)
    np.testing.assert_allclose(h, ref_h, rtol=rtol, atol=rtol * np.abs(ref_h).max())
    np.testing.assert_allclose(out, ref_out, rtol=rtol, atol=rtol * np.abs(ref_out).max())
    np.testing.assert_allclose(float(value.asnumpy()), float(ref_value.asnumpy()), rtol=rtol)
    tolerances = gradient_tolerance([g.asnumpy() for g in ref_grads], reduction_length(ref.trainable_params(), 32))
    for g, r, tol, param in zip(grads, ref_grads, tolerances, ref.trainable_params()):
        assert_within(g.asnumpy(), r.asnumpy(), tol, param.name)


def test_dropout_draws_advance_like_single_device(clean_context):
    """Three forwards: nn.Dropout's primitive keeps a generator state that advances per call, and
    ops.dropout takes new seeds per call; each forward's masks equal the single device's, and
    differ from the previous forward's. The same at world sizes 2 and 4."""
    ref = _build(0.5, 0.5)
    ms.set_seed(5)
    ref_h = [ref(X)[0].asnumpy() for _ in range(3)]
    assert (ref_h[0] == 0).tolist() != (ref_h[1] == 0).tolist()
    for size in (2, 4):
        clean_context.set_context(device_num=size)
        sim = simulate(_build(0.5, 0.5), Layout((size,), ("data",))(tensor_map=()))
        ms.set_seed(5)
        for step, want in enumerate(ref_h):
            np.testing.assert_array_equal(sim(X)[0].asnumpy() == 0, want == 0, err_msg=f"size {size} step {step}")


def test_float16_dropout_bitwise(clean_context):
    """A float16 dropout on a split tensor: the kernel scales in float32 and rounds once; the
    sharded path does the same, bitwise equal, forward and backward."""
    clean_context.set_context(device_num=4)

    class Half(nn.Cell):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(p=0.3)

        def construct(self, x):
            return self.drop(x)

    x16 = X.astype(ms.float16)
    ms.set_seed(3)
    ref = Half()
    ms.set_seed(3)
    par = Half()
    ref.set_train()
    par.set_train()
    sim = simulate(par, Layout((2, 2), ("data", "seq"))(tensor_map=(), input_map=("data", "seq")))
    weight = Tensor(RNG.standard_normal(X.shape).astype(np.float16))
    ref_out, ref_grad = ms.value_and_grad(lambda a: (ref(a) * weight).sum())(x16)
    out, grad = ms.value_and_grad(lambda a: (sim(a) * weight).sum())(x16)
    del out, ref_out  # summed in float16 in different orders; the pieces are what must agree
    np.testing.assert_array_equal(sim(x16).asnumpy(), ref(x16).asnumpy())  # third draw of each, bitwise
    np.testing.assert_array_equal(grad.asnumpy(), ref_grad.asnumpy())


def test_other_random_ops_draw_once_globally(clean_context):
    """ops.bernoulli (a seed given: unseeded it is not reproducible even on one device),
    ops.normal with a DTensor mean, ops.multinomial, ops.rand_like and ops.randn: the single
    device's values; the ops with DTensor inputs run once on the gathered inputs (replication
    fallbacks)."""
    clean_context.set_context(device_num=4)

    class Noise(nn.Cell):
        def construct(self, x):
            probs = ops.softmax(x.reshape(32, 16), -1)
            picks = ops.multinomial(probs, 3).astype(ms.float32).reshape(8, 4, 3).sum(-1, keepdims=True)
            return (ops.bernoulli(x, 0.5, seed=3) + ops.normal(x.shape, x, 1.0) + ops.rand_like(x)
                    + ops.randn(x.shape) + picks)

    ms.set_seed(21)
    want = Noise()(X).asnumpy()
    sim = simulate(Noise(), Layout((2, 2), ("data", "seq"))(tensor_map=(), input_map=("data", "seq")))
    ms.set_seed(21)
    got = sim(X).asnumpy()
    np.testing.assert_array_equal(got, want)
    fallbacks = sim.report().fallbacks
    assert fallbacks.get("Bernoulli", 0) == 1 and fallbacks.get("Multinomial", 0) == 1, fallbacks


def test_inplace_random_refused(clean_context):
    clean_context.set_context(device_num=4)

    class Fill(nn.Cell):
        def construct(self, x):
            y = x * 1.0
            y.uniform_()
            return y

    sim = simulate(Fill(), Layout((4,), ("data",))(tensor_map=()))
    with pytest.raises(DTensorOpError, match="^InplaceUniform: in-place random op"):
        sim(X)


def test_five_training_steps_with_dropout_equal_single_device(clean_context):
    """Data x tensor parallel training with dropout on: losses and parameters after 5 momentum-SGD
    steps equal single-device training (masks drawn identically at every step)."""
    clean_context.set_context(device_num=4)

    class WithLoss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = DropNet(0.25, 0.1)

        def construct(self, x):
            h, out = self.net(x)
            return (out * out).mean() + h.mean()

    ms.set_seed(11)
    ref = WithLoss()
    ms.set_seed(11)
    par = WithLoss()
    ref.set_train()
    par.set_train()
    s = Layout((2, 2), ("data", "tensor"))(tensor_map=())
    s.override("net.fc1.*", "tensor")
    s.override("net.fc2.weight", None, "tensor")
    sim = simulate(par, s)
    ref_opt = nn.Momentum(ref.trainable_params(), 0.05, 0.9)
    opt = nn.Momentum(sim.optimizer_parameters(), 0.05, 0.9)
    ref_step = ms.value_and_grad(ref, None, ref_opt.parameters)
    ref_losses, losses = [], []
    ms.set_seed(5)  # ops.dropout's seeds come from the global seed's counter: each run restarts it
    for _ in range(5):
        loss, grads = ref_step(X)
        ref_opt(grads)
        ref_losses.append(float(loss.asnumpy()))
    ms.set_seed(5)
    for _ in range(5):
        losses.append(float(sim.train_step(opt, X).asnumpy()))
    rtol = training_rtol(reduction_length(ref.trainable_params(), 32), 5)
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol)
    for p, q in zip(ref.trainable_params(), par.trainable_params()):
        a, b = p.asnumpy().astype(np.float64), q.asnumpy().astype(np.float64)
        assert np.linalg.norm(a - b) <= rtol * np.linalg.norm(a), p.name
