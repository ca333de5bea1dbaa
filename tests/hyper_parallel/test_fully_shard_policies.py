"""Upstream's fully_shard policies and `HSDPModule` settings: the no-op policies train equal to
one device, `set_reduce_op_type` acts, the prefetch setters keep the values; the rest is refused."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn

from mindspore_hyper.hyper_parallel import Shard, distribute_tensor, init_device_mesh
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard
from mindspore_hyper.hyper_parallel.fully_shard_policies import (
    CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy,
)
from mindspore_hyper.hyper_parallel.hsdp_module import HSDPModule

from test_fully_shard import Mlp, check_same, copy_weights, train

# One step's gradients: the same float32 ops; the gathered/reduced sums (<= 16 terms) differ in order
# only: relative ~ 16 * 2^-24 ~ 1e-6.
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-7


def _mesh():
    return init_device_mesh("npu", (4,), mesh_dim_names=("dp",))


def test_no_op_policies_and_prefetch_train_equal_to_one_device(fresh_session):
    """OffloadPolicy() (no offload) and a float32 reduce for a float32 model change nothing; the
    Cells become HSDPModule and record their prefetch lists; 3 Adam steps equal one device."""
    fresh_session.set_context(device_num=4)
    ms.set_seed(0)
    model, reference = Mlp(), Mlp()
    copy_weights(model, reference)
    mesh = _mesh()
    config = dict(mesh=mesh, offload_policy=OffloadPolicy(), mp_policy=MixedPrecisionPolicy(reduce_dtype=ms.float32))
    fully_shard(model.up, **config)
    fully_shard(model.down, **config)
    fully_shard(model, **config)
    assert all(isinstance(c, HSDPModule) for c in (model.up, model.down, model)) and isinstance(model, Mlp)
    model.up.set_modules_to_forward_prefetch([model.down])
    model.down.set_modules_to_backward_prefetch([model.up])
    assert model.up.forward_prefetch == [model.down] and model.down.backward_prefetch == [model.up]
    y = Tensor(np.random.RandomState(1).randn(4, 8).astype(np.float32))
    as_input = lambda x: distribute_tensor(x, mesh, [Shard(0)])  # noqa: E731
    np.testing.assert_allclose(train(model, as_input, y), train(reference, lambda x: x, y), rtol=1e-5)
    check_same(model, reference)


def _grads(model, x):
    return [g.asnumpy() for g in ms.value_and_grad(lambda x: (model(x) ** 2).mean(), None,
                                                    model.trainable_params())(x)[1]]


def test_set_reduce_op_type_sums_instead_of_averaging(fresh_session):
    """A plain batch in simulation is every rank's batch: "avg" (fully_shard's default) gives one
    device's gradient, "sum" the 4 equal ranks' sum, 4 x it (upstream's sum without division)."""
    fresh_session.set_context(device_num=4)
    ms.set_seed(0)
    model, reference = Mlp(), Mlp()
    copy_weights(model, reference)
    fully_shard(model, mesh=_mesh())
    x = Tensor(np.random.RandomState(2).randn(4, 8).astype(np.float32))
    want = _grads(reference, x)
    for got, one in zip(_grads(model, x), want):
        np.testing.assert_allclose(got, one, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    model.set_reduce_op_type("sum")
    for got, one in zip(_grads(model, x), want):
        np.testing.assert_allclose(got, 4 * one, rtol=GRAD_RTOL, atol=4 * GRAD_ATOL)


def test_policies_and_settings_that_would_change_values_are_refused(fresh_session):
    fresh_session.set_context(device_num=4)
    mesh = _mesh()
    with pytest.raises(ValueError, match="host offload"):
        fully_shard(Mlp(), mesh=mesh, offload_policy=CPUOffloadPolicy())
    with pytest.raises(ValueError, match="offload_policy must be an OffloadPolicy"):
        fully_shard(Mlp(), mesh=mesh, offload_policy="cpu")
    with pytest.raises(ValueError, match="reduce_dtype=Float16"):
        fully_shard(Mlp(), mesh=mesh, mp_policy=MixedPrecisionPolicy(reduce_dtype=ms.float16))
    with pytest.raises(ValueError, match="apply_grad_on_fp32_main_grad='yes'.*expected a bool"):
        fully_shard(Mlp(), mesh=mesh, mp_policy=MixedPrecisionPolicy(apply_grad_on_fp32_main_grad="yes"))
    extra = Parameter(Tensor(np.ones(4, np.float32)), name="extra")
    with pytest.raises(ValueError, match="replicate_params"):
        fully_shard(Mlp(), mesh=mesh, replicate_params=[extra])
    model = fully_shard(Mlp(), mesh=mesh)
    with pytest.raises(ValueError, match="Unsupported reduce op type 'max'"):
        model.set_reduce_op_type("max")
    with pytest.raises(ValueError, match="list of fully_shard Cells"):
        model.set_modules_to_forward_prefetch([nn.Dense(2, 2)])
