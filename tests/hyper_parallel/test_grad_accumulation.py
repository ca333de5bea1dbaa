"""Gradient accumulation without synchronisation (hsdp's `set_requires_grad_sync`, fully_shard's
`set_requires_gradient_sync`) and hsdp's timing options, in simulation, against one device on
the concatenated micro-batches (the msrun case: rank_checks.py).

The loss sums over the batch, so one device's gradient on the concatenated micro-batches is the
sum of the micro-batches' gradients; the Adam step after it compares the weights. Tolerances:
float32 sums of <= 12 x 16 products reordered by the split and by the accumulation (a few ulp of
gradients of size ~10), then one Adam step of lr 1e-2 whose direction g / |g| carries that
relative error: 1e-5 relative on gradients, 1e-6 absolute on weights.
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.hyper_parallel import distribute_tensor, fully_shard, hsdp, init_device_mesh, Shard


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = Parameter(Tensor(np.random.RandomState(0).randn(16, 8).astype(np.float32)), name="weight")
        self.bias = Parameter(Tensor(np.random.RandomState(1).randn(8).astype(np.float32)), name="bias")

    def construct(self, x):
        return ops.tanh(ops.matmul(x, self.weight) + self.bias).sum()


def batches(k):
    return [np.random.RandomState(10 + j).randn(4, 16).astype(np.float32) for j in range(k)]


def one_device(k):
    """Gradients and Adam-stepped weights of one device on the k micro-batches concatenated."""
    net = Net()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    grads = ms.value_and_grad(net, None, optimizer.parameters)(Tensor(np.concatenate(batches(k))))[1]
    optimizer(grads)
    return [g.asnumpy() for g in grads], [p.asnumpy() for p in net.trainable_params()]


def check(grads, weights, k):
    reference_grads, reference_weights = one_device(k)
    for g, r in zip(grads, reference_grads):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    for w, r in zip(weights, reference_weights):
        np.testing.assert_allclose(w, r, rtol=0, atol=1e-6)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("global_batch", [False, True])
def test_hsdp_accumulates_micro_batches_and_synchronises_once(fresh_session, k, global_batch):
    """Upstream's hsdp.py loop: zero_grads, sync off, on for the last micro-batch, Adam on the
    last backward's gradients. Plain inputs are the same batch on all 4 ranks, summed: grad_scale
    1/4 gives one device's; a DTensor batch split over "dp" is one global batch."""
    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    model = hsdp(Net(), threshold=0, enable_grad_accumulation=True, grad_scale=1.0 if global_batch else 0.25)
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    step = (lambda x: model(distribute_tensor(x, mesh, [Shard(0)]))) if global_batch else model
    grad_fn = ms.value_and_grad(step, None, optimizer.parameters)
    model.zero_grads()
    model.set_requires_grad_sync(False)
    running = 0
    for j, x in enumerate(batches(k)):
        if j == k - 1:
            model.set_requires_grad_sync(True)
        grads = grad_fn(Tensor(x))[1]
        # in simulation the running sum returned while off is the group's (grad_accumulation.py)
        running = one_device(j + 1)[0]
        for g, r in zip(grads, running):
            np.testing.assert_allclose(g.asnumpy(), r, rtol=1e-5, atol=1e-5)
    # kept until zero_grads(): one more synchronised backward adds to it; after zero_grads it starts over
    again = grad_fn(Tensor(batches(1)[0]))[1]
    np.testing.assert_allclose(again[0].asnumpy(), running[0] + one_device(1)[0][0], rtol=1e-5, atol=1e-5)
    model.zero_grads()
    fresh = grad_fn(Tensor(batches(1)[0]))[1]
    np.testing.assert_allclose(fresh[0].asnumpy(), one_device(1)[0][0], rtol=1e-5, atol=1e-5)
    optimizer(grads)  # the loop's last gradients
    check([g.asnumpy() for g in grads], [p.asnumpy() for p in model.trainable_params()], k)


@pytest.mark.parametrize("k", [2, 3])
def test_fully_shard_gradient_sync_off_defers_the_reduction(fresh_session, k):
    """Torch FSDP2's loop: set_requires_gradient_sync(False) on all micro-batches but the last:
    they return zero gradients (nothing reached the shards yet), the last returns the sum."""
    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    model = fully_shard(Net(), mesh=mesh)
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    grad_fn = ms.value_and_grad(model, None, optimizer.parameters)
    for j, x in enumerate(batches(k)):
        model.set_requires_gradient_sync(j == k - 1)
        grads = grad_fn(Tensor(x))[1]
        if j < k - 1:
            assert all(not g.asnumpy().any() for g in grads)
    # the sum was emptied by the synchronising backward: the next one is its own micro-batch's
    np.testing.assert_allclose(grad_fn(Tensor(batches(1)[0]))[1][0].asnumpy(), one_device(1)[0][0], rtol=1e-5,
                               atol=1e-5)
    optimizer(grads)  # the loop's last gradients
    check([g.asnumpy() for g in grads], [p.asnumpy() for p in model.trainable_params()], k)


def test_fully_shard_recurse_sets_inner_cells(fresh_session):
    """fully_shard bottom-up: recurse=True (torch's default) turns the inner Cell's sync off too;
    recurse=False leaves it on."""
    fresh_session.set_context(device_num=2)
    mesh = init_device_mesh("npu", (2,), mesh_dim_names=("dp",))

    class Outer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = fully_shard(Net(), mesh=mesh)
            self.scale = Parameter(Tensor(np.ones(2, np.float32)), name="scale")

        def construct(self, x):
            return self.inner(x) * self.scale.sum()

    outer = fully_shard(Outer(), mesh=mesh)
    outer.set_requires_gradient_sync(False, recurse=False)
    assert not outer.fsdp_state.accumulation.sync and outer.inner.fsdp_state.accumulation.sync
    outer.set_requires_gradient_sync(False)
    assert not outer.inner.fsdp_state.accumulation.sync


def test_bad_flags_are_refused_by_name(fresh_session):
    fresh_session.set_context(device_num=2)
    mesh = init_device_mesh("npu", (2,), mesh_dim_names=("dp",))
    with pytest.raises(ValueError, match="requires_grad_sync must be bool but got 0"):
        hsdp(Net(), threshold=0, enable_grad_accumulation=True).set_requires_grad_sync(0)
    sharded = fully_shard(Net(), mesh=mesh)
    with pytest.raises(ValueError, match="requires_gradient_sync must be bool but got 'no'"):
        sharded.set_requires_gradient_sync("no")
    with pytest.raises(ValueError, match="recurse must be bool but got None"):
        sharded.set_requires_gradient_sync(False, recurse=None)
    for options, message in (({"comm_async": 1}, "comm_async must be bool but got 1"),
                             ({"comm_fusion": "on"}, "comm_fusion must be bool but got 'on'"),
                             ({"bucket_size": -2}, r"bucket_size must be an integer >= 0 \(bytes\) or -1"),
                             ({"bucket_size": 1.5}, "bucket_size must be an integer"),
                             ({"use_eager_hook": None}, "use_eager_hook must be bool but got None"),
                             ({"use_eager_hook": False}, r"use_eager_hook=False\): upstream then registers its "
                                                         "gradient hooks as a compiled MindSpore graph pass")):
        with pytest.raises(ValueError, match=message):
            hsdp(Net(), **options)


def test_comm_async_fusion_and_buckets_give_the_same_values(fresh_session):
    """Timing choices upstream (a side stream, fused buckets): here the same synchronous
    reductions, so the gradients are bit-equal to the defaults'; hsdp_sync_stream returns at once."""
    from mindspore_hyper.hyper_parallel import hsdp_sync_stream

    fresh_session.set_context(device_num=4)
    init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    x = Tensor(batches(1)[0])
    plain = hsdp(Net(), threshold=0)
    timed = hsdp(Net(), threshold=0, comm_async=True, comm_fusion=True, bucket_size=1024)
    expected = ms.value_and_grad(plain, None, plain.trainable_params())(x)[1]
    got = ms.value_and_grad(timed, None, timed.trainable_params())(x)[1]
    hsdp_sync_stream()
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g.asnumpy(), e.asnumpy())


def test_fully_shard_accumulation_through_loss_backward(fresh_session):
    """Torch-style `loss.backward()` (autograd_compat.py): `.grad` adds each backward's returned
    gradient, zeros while off, so after k = 3 micro-batches it holds the sum once (not 3 times)."""
    from mindspore_hyper.hyper_parallel.autograd_compat import (
        disable_mindspore_backward_compat, enable_mindspore_backward_compat,
    )

    fresh_session.set_context(device_num=4)
    model = fully_shard(Net(), mesh=init_device_mesh("npu", (4,), mesh_dim_names=("dp",)))
    enable_mindspore_backward_compat()
    try:
        for j, x in enumerate(batches(3)):
            model.set_requires_gradient_sync(j == 2)
            model(Tensor(x)).backward()
        got = [p.grad.asnumpy() for p in model.trainable_params()]
        model.zero_grad()
    finally:
        disable_mindspore_backward_compat()
    for g, r in zip(got, one_device(3)[0]):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
