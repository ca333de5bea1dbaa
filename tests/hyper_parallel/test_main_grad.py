"""fully_shard's `apply_grad_on_fp32_main_grad` (MindFormers 2.0's FSDP policy): each backward
adds the reduced gradients onto `param.main_grad`; accumulated over micro-batches and used by
the optimizer, they train equal to one device."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindspore_hyper.hyper_parallel import distribute_tensor, init_device_mesh, Shard
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard
from mindspore_hyper.hyper_parallel.fully_shard_policies import MixedPrecisionPolicy

from test_fully_shard import Mlp, copy_weights

# Gradients: the same float32 ops on 4 devices and on one; the gathered/reduced sums (<= 16 terms)
# differ in order only: relative ~ 16 * 2^-24 ~ 1e-6, two micro-batches summed double it at most.
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-7
# 3 Adam steps move each weight by <= 3 * lr = 3e-2 with update directions from those gradients;
# a missing or doubled micro-batch moves weights by O(lr) = 1e-2.
ADAM_ATOL = 1e-5
POLICY = MixedPrecisionPolicy(reduce_dtype=ms.float32, apply_grad_on_fp32_main_grad=True)


def _sharded(mesh):
    model = Mlp()
    for cell in (model.up, model.down):
        fully_shard(cell, mesh=mesh, mp_policy=POLICY)
    return fully_shard(model, mesh=mesh, mp_policy=POLICY)


def _batches():
    rng = np.random.RandomState(3)
    return [(Tensor(rng.randn(4, 8).astype(np.float32)), Tensor(rng.randn(4, 8).astype(np.float32)))
            for _ in range(2)]


def test_main_grad_sums_the_micro_batches_gradients_like_one_device(fresh_session):
    fresh_session.set_context(device_num=4)
    ms.set_seed(0)
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    model, reference = _sharded(mesh), Mlp()
    copy_weights(model, reference)
    params = model.trainable_params()
    assert all(p.main_grad is None for p in params)
    loss_of = lambda m, wrap: lambda x, y: ((m(wrap(x)) - y) ** 2).mean()  # noqa: E731
    as_global = lambda x: distribute_tensor(x, mesh, [Shard(0)])  # noqa: E731  one global batch over "dp"
    want = [np.zeros(p.shape, np.float32) for p in params]
    for x, y in _batches():  # two micro-batches, one backward each
        returned = ms.value_and_grad(loss_of(model, as_global), None, params)(x, y)[1]
        one = ms.value_and_grad(loss_of(reference, lambda v: v), None, reference.trainable_params())(x, y)[1]
        for got, single in zip(returned, one):  # the backward's own result is unchanged
            np.testing.assert_allclose(got.asnumpy(), single.asnumpy(), rtol=GRAD_RTOL, atol=GRAD_ATOL)
        want = [w + g.asnumpy() for w, g in zip(want, one)]
    for param, total in zip(params, want):
        assert param.main_grad.dtype == ms.float32, param.name
        np.testing.assert_allclose(param.main_grad.asnumpy(), total, rtol=2 * GRAD_RTOL, atol=2 * GRAD_ATOL,
                                   err_msg=param.name)
    model.zero_grad(set_to_none=False)
    assert all(not p.main_grad.asnumpy().any() for p in params)
    model.zero_grad()
    assert all(p.main_grad is None for p in params)


def test_an_optimizer_on_main_grad_trains_like_one_device(fresh_session):
    """MindFormers' loop: backward, the optimizer on `main_grad`, `zero_grad`; 3 Adam steps."""
    fresh_session.set_context(device_num=4)
    ms.set_seed(0)
    model, reference = _sharded(init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))), Mlp()
    copy_weights(model, reference)
    x, y = _batches()[0]
    optimizer, one_optimizer = (nn.Adam(m.trainable_params(), learning_rate=1e-2) for m in (model, reference))
    grad_fn = ms.value_and_grad(lambda x, y: ((model(x) - y) ** 2).mean(), None, optimizer.parameters)
    one_fn = ms.value_and_grad(lambda x, y: ((reference(x) - y) ** 2).mean(), None, one_optimizer.parameters)
    for _ in range(3):
        grad_fn(x, y)  # a plain batch: every rank's, averaged (fully_shard's "avg")
        optimizer(tuple(p.main_grad for p in optimizer.parameters))
        model.zero_grad()
        one_optimizer(one_fn(x, y)[1])
    for (name, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), atol=ADAM_ATOL, err_msg=name)


def test_without_the_policy_there_is_no_main_grad(fresh_session):
    fresh_session.set_context(device_num=4)
    model = fully_shard(Mlp(), mesh=init_device_mesh("cpu", (4,), mesh_dim_names=("dp",)))
    x, y = _batches()[0]
    ms.value_and_grad(lambda x, y: ((model(x) - y) ** 2).mean(), None, model.trainable_params())(x, y)
    assert all(getattr(p, "main_grad", None) is None for p in model.trainable_params())
