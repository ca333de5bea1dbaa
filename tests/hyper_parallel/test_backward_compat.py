"""enable_mindspore_backward_compat (MindFormers 2.0's Trainer): torch-style `loss.backward(sense)`
and `param.grad` through tensor-parallel styles and fully_shard in simulation, against one
device's `mindspore.value_and_grad` gradients (one rank per process: rank_checks.py under msrun,
test_per_rank.py)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.hyper_parallel import (
    ColwiseParallel, RowwiseParallel, Shard, distribute_tensor, init_device_mesh, parallelize_module,
)
from mindspore_hyper.hyper_parallel.autograd_compat import (
    backward_compat_enabled, disable_mindspore_backward_compat, enable_mindspore_backward_compat,
)
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard
from mindspore_hyper.hyper_parallel.fully_shard_policies import MixedPrecisionPolicy

from test_fully_shard import Mlp, copy_weights

# One backward's gradients: the same float32 ops on 4 devices and on one; sharded sums (<= 16
# terms) differ in order only: relative ~ 16 * 2^-24 ~ 1e-6; accumulating two backwards doubles it.
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-7
SENSE = 0.25  # MindFormers' sense for 4 data-parallel devices


@pytest.fixture
def compat(fresh_session):
    """The patch, undone after the test (it changes MindSpore's tensor class for the process)."""
    fresh_session.set_context(device_num=4)
    enable_mindspore_backward_compat()
    yield fresh_session
    disable_mindspore_backward_compat()


def _batch(seed=0):
    rng = np.random.RandomState(seed)
    return Tensor(rng.randn(4, 8).astype(np.float32)), Tensor(rng.randn(4, 8).astype(np.float32))


def _one_device(reference, x, y, scale=1.0):
    loss = lambda x, y: ((reference(x) - y) ** 2).mean() * scale  # noqa: E731
    grads = [g.asnumpy() for g in ms.value_and_grad(loss, None, reference.trainable_params())(x, y)[1]]
    enable_mindspore_backward_compat()  # value_and_grad turned MindSpore's grad flag off
    return grads


def _check(params, want, what, factor=1):
    for param, grad in zip(params, want):
        got = getattr(param, what)
        assert got is not None, f"{param.name}.{what}"
        np.testing.assert_allclose(got.asnumpy(), grad, rtol=factor * GRAD_RTOL, atol=factor * GRAD_ATOL,
                                   err_msg=f"{param.name}.{what}")


def test_fully_shard_backward_with_sense_fills_grad_and_main_grad(compat):
    ms.set_seed(0)
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    policy = MixedPrecisionPolicy(reduce_dtype=ms.float32, apply_grad_on_fp32_main_grad=True)
    model, reference = Mlp(), Mlp()
    copy_weights(model, reference)
    for cell in (model.up, model.down, model):
        fully_shard(cell, mesh=mesh, mp_policy=policy)
    params = model.trainable_params()
    x, y = _batch()
    loss = ((model(distribute_tensor(x, mesh, [Shard(0)])) - y) ** 2).mean()  # one global batch
    loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
    loss.backward(Tensor(SENSE, ms.float32))
    want = _one_device(reference, x, y, SENSE)
    _check(params, want, "grad")
    _check(params, want, "main_grad")
    loss = ((model(distribute_tensor(x, mesh, [Shard(0)])) - y) ** 2).mean()
    (loss.full_tensor() if hasattr(loss, "full_tensor") else loss).backward(Tensor(SENSE, ms.float32))
    _check(params, [2 * g for g in want], "grad", factor=2)  # backward accumulates, as torch's
    _check(params, [2 * g for g in want], "main_grad", factor=2)
    model.zero_grad()
    assert all(p.grad is None and p.main_grad is None for p in params)


def test_colwise_rowwise_backward_gives_one_device_gradients(compat):
    ms.set_seed(1)
    model, reference = Mlp(), Mlp()
    copy_weights(model, reference)
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x, y = _batch(1)
    ((model(x) - y) ** 2).mean().backward()
    _check(model.trainable_params(), _one_device(reference, x, y), "grad")


def test_a_training_loop_on_backward_equals_one_device(compat):
    """backward, Adam on `.grad`, zero_grad: 3 steps of a fully sharded model equal one device's
    (3 Adam steps move a weight by <= 3e-2; a wrong or missing gradient by O(1e-2))."""
    ms.set_seed(2)
    model, reference = Mlp(), Mlp()
    copy_weights(model, reference)
    fully_shard(model, mesh=init_device_mesh("cpu", (4,), mesh_dim_names=("dp",)))
    optimizer, one_optimizer = (nn.Adam(m.trainable_params(), learning_rate=1e-2) for m in (model, reference))
    x, y = _batch(2)
    for _ in range(3):
        ((model(x) - y) ** 2).mean().backward()
        optimizer(tuple(p.grad for p in optimizer.parameters))
        model.zero_grad()
        one_optimizer(tuple(Tensor(g) for g in _one_device(reference, x, y)))
    for (name, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), atol=1e-5, err_msg=name)


def test_bad_backward_calls_are_refused_and_disable_restores_mindspore(compat):
    out = ops.ones((2, 3), ms.float32) * 2
    with pytest.raises(RuntimeError, match=r"only for scalar outputs; this output has shape \(2, 3\)"):
        out.backward()
    with pytest.raises(RuntimeError, match=r"gradient has a shape of \(3,\) and the output has a shape of \(2, 3\)"):
        out.backward(ops.ones((3,), ms.float32))
    with pytest.raises(TypeError, match="backward\\(gradient=...\\): expected a Tensor or None, got float"):
        out.sum().backward(0.5)
    with pytest.raises(TypeError, match="Tensor.grad = str: expected a Tensor or None"):
        out.grad = "zero"
    net = nn.Dense(8, 8)
    ms.value_and_grad(lambda x: net(x).sum(), None, net.trainable_params())(_batch()[0])
    with pytest.raises(RuntimeError, match="grad flag is off .* call enable_mindspore_backward_compat\\(\\) again"):
        net(_batch()[0]).sum().backward()
    assert backward_compat_enabled()
    disable_mindspore_backward_compat()
    assert not backward_compat_enabled() and not hasattr(Tensor(1.0), "backward")
    assert nn.Cell._call_custom_bprop is nn.Cell.__dict__["_call_custom_bprop"] and \
        nn.Cell._call_custom_bprop.__module__ == "mindspore.nn.cell"


class _CustomBprop(nn.Cell):
    """A Cell with a custom bprop (as ring attention's and MoE's token exchange are)."""

    def construct(self, x):
        return x * 2

    def bprop(self, x, out, dout):
        return (dout * 2,)


def test_a_cell_with_a_custom_bprop_is_refused_named_and_value_and_grad_still_runs_it(compat):
    x = ms.Parameter(Tensor(np.ones((2,), np.float32)), name="x")
    with pytest.raises(NotImplementedError, match=r"cannot differentiate _CustomBprop, a Cell with a custom bprop.*"
                                                  r"mindspore.value_and_grad\(loss_fn, None, params\)"):
        _CustomBprop()(x).sum().backward()
    grad = ms.value_and_grad(lambda: _CustomBprop()(x).sum(), None, [x])()[1][0]
    np.testing.assert_array_equal(grad.asnumpy(), [2.0, 2.0])  # the bprop's, exact
