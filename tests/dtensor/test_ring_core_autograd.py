"""Ring attention (`ring_core.RingAttention`) differentiates the same through
`mindspore.value_and_grad` and through MindSpore's `run_backward` (torch-style `loss.backward()`),
which could not run its former custom-bprop Cell: in simulation (`LocalRing`, every member here)
and over the msrun transport (`ProcessRing` on `ProcessCollectives`, one member per process); and
`loss.backward()` through a ring GPT equals `value_and_grad`.

The msrun case runs member 0 of a ring of 2 in this process; the other member holds the same
values (a mirror communicator: what it sends is what this member sends). The global sequence is
then this member's chunk twice, and the reference is MindSpore's autodiff of plain attention on
it, read at this member's half."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, ops

import mindspore_hyper as mh
from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.comm.process_collectives import ProcessCollectives
from mindspore_hyper.dtensor.context_parallel.ring_core import RingAttention, RingPlan
from mindspore_hyper.dtensor.context_parallel.ring_transports import LocalRing, ProcessRing
from mindspore_hyper.dtensor.context_parallel.scores import Step
from mindspore_hyper.hyper_parallel.autograd_compat import (
    disable_mindspore_backward_compat, enable_mindspore_backward_compat,
)

from test_context_parallel import _gpt, _gpt_inputs, _strategy
from autograd_paths import both_ways

pytestmark = pytest.mark.usefixtures("pynative")

B, H, T, D = 1, 2, 8, 4
RNG = np.random.default_rng(3)
STEPS = (Step("div", 2.0),)


class _Mirror:
    """Member 0 of a ring of 2 whose other member sends what this one sends."""

    def __init__(self):
        self.sent = []

    def send(self, a, peer):
        self.sent.append(np.array(a))

    def recv(self, shape, dtype, peer):
        a = self.sent.pop(0)
        assert a.shape == tuple(shape) and a.dtype == dtype
        return a


def _reference(q, k, v, c):
    scores = ops.matmul(q, k.swapaxes(-1, -2)) / 2.0
    return (ops.matmul(ops.softmax(scores, -1), v) * c).sum()


def _close(got, want, name):
    # the ring's online softmax and blockwise backward sum in another order than plain attention
    # (float32, a handful of terms per element): a few ulps of the largest value
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=name)


@pytest.mark.parametrize("n", [2, 4])
def test_simulated_ring_gives_plain_attentions_gradient_both_ways(n):
    q, k, v, c = (RNG.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(4))
    params = [Parameter(Tensor(a), name=name) for a, name in ((q, "q"), (k, "k"), (v, "v"))]
    plan = RingPlan(n, tuple(range(n)), 1, STEPS, np.zeros((n, n), bool), (T, T))

    def loss():
        core = RingAttention(plan, LocalRing(lambda nbytes, backward: None), [[None]] * n)
        qs, kts, vs = (ops.split(x, T // n, dim) for x, dim in ((params[0] * 1, 2),
                                                                  (params[1].swapaxes(-1, -2), 3), (params[2] * 1, 2)))
        out = ops.concat(core(*[x for r in range(n) for x in (qs[r], kts[r], vs[r])]), 2)
        return (out * Tensor(c)).sum()

    want = ms.value_and_grad(_reference, (0, 1, 2))(Tensor(q), Tensor(k), Tensor(v), Tensor(c))[1]
    by_value_and_grad, by_run_backward = both_ways(loss, params)
    for name, w, g1, g2 in zip("qkv", want, by_value_and_grad, by_run_backward):
        _close(g1, w.asnumpy(), name)
        _close(g2, w.asnumpy(), name)


def test_msrun_ring_gives_plain_attentions_gradient_both_ways():
    q, k, v, c = (RNG.standard_normal((B, H, T // 2, D)).astype(np.float32) for _ in range(4))
    params = [Parameter(Tensor(a), name=name) for a, name in ((q, "q"), (k, "k"), (v, "v"))]
    plan = RingPlan(2, (0,), 1, STEPS, np.zeros((2, 2), bool), (T, T))
    records = []
    collectives = ProcessCollectives(lambda ranks: _Mirror())
    group = AxisGroup("cp", (0, 1), (0,))

    def loss():
        ring = ProcessRing(collectives, group, lambda nbytes, backward: records.append((nbytes, backward)))
        core = RingAttention(plan, ring, [[None]])
        (out,) = core(params[0] * 1, params[1].swapaxes(-1, -2), params[2] * 1)
        return (out * Tensor(c)).sum()

    twice = [Tensor(np.concatenate([a, a], 2)) for a in (q, k, v, c)]
    want = ms.value_and_grad(_reference, (0, 1, 2))(*twice)[1]
    by_value_and_grad, by_run_backward = both_ways(loss, params)
    for name, w, g1, g2 in zip("qkv", want, by_value_and_grad, by_run_backward):
        _close(g1, w.asnumpy()[:, :, :T // 2], name)  # this member's half of the global gradient
        _close(g2, w.asnumpy()[:, :, :T // 2], name)
    shard = B * H * (T // 2) * D * 4
    # per loss: forward 1 K/V shift; backward the K/V, then the accumulators of the K/V worked with, then
    # the accumulators home (each K and V, or their gradients: two shards)
    assert records == [(2 * shard, False), (2 * shard, True), (2 * shard, True), (2 * shard, True)] * 2


def test_loss_backward_through_a_ring_gpt_equals_value_and_grad(clean_context):
    """`loss.backward()` (the Trainer's, `enable_mindspore_backward_compat`) through the examples'
    GPT with ring attention on cp 4 in simulation: every parameter's `.grad` is
    `value_and_grad`'s (the same ops, bit for bit)."""
    clean_context.set_context(mode="simulation", device_num=4)
    inputs, labels = _gpt_inputs()
    parallel = mh.auto_parallelize(_gpt(), _strategy("cp4", "ring", "gpt"))
    params = parallel.network.trainable_params()
    _, grads = ms.value_and_grad(parallel, None, params)(*inputs, *labels)
    enable_mindspore_backward_compat()
    try:
        parallel(*inputs, *labels).backward()
        for param, grad in zip(params, grads):
            assert param.grad is not None, param.name
            np.testing.assert_array_equal(param.grad.asnumpy(), grad.asnumpy(), err_msg=param.name)
    finally:
        disable_mindspore_backward_compat()
