"""Laying a model out inside MindSpore's `DeviceCtx("meta")`, as MindFormers 2.0's
`parallelize_gptmodel` calls fully_shard and parallelize_module (host_device.py): a model holding
values keeps them (its pieces are cut on the host), a model built on the meta device (no values)
is refused by name. Under msrun, where each process's piece is a new Parameter, the same is
checked by the 4-process job (rank_checks.py)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn
from mindspore.device_manager import get_current_device

from mindspore_hyper.hyper_parallel import ColwiseParallel, RowwiseParallel, init_device_mesh, parallelize_module
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard
from mindspore_hyper.hyper_parallel.host_device import on_host

from test_fully_shard import Mlp, copy_weights

# 3 Adam steps (lr 1e-2) of the same float32 model; the 4-device sums (<= 16 terms) differ from
# one device's in order only (~1e-6 relative), a lost or zeroed piece moves weights by O(lr)
ADAM_ATOL = 1e-5


def _adam_steps(model):
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    rng = np.random.RandomState(0)
    x, y = (Tensor(rng.randn(4, 8).astype(np.float32)) for _ in range(2))
    grad_fn = ms.value_and_grad(lambda a, b: ((model(a) - b) ** 2).mean(), None, optimizer.parameters)
    for _ in range(3):
        optimizer(grad_fn(x, y)[1])


@pytest.mark.parametrize("lay_out", ["fully_shard", "colwise_rowwise"])
def test_a_model_laid_out_inside_a_meta_context_keeps_its_values(fresh_session, lay_out):
    fresh_session.set_context(device_num=4)
    ms.set_seed(0)
    model, reference = Mlp(), Mlp()
    copy_weights(model, reference)
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    with ms.DeviceCtx("meta"):  # MindFormers' parallelize.py wraps its fully_shard calls so
        if lay_out == "fully_shard":
            fully_shard(model.up, mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    assert all(p.device == "CPU" for p in model.trainable_params())
    _adam_steps(model)
    _adam_steps(reference)
    for (name, got), (_, want) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=0, atol=ADAM_ATOL, err_msg=name)


def test_a_model_built_on_the_meta_device_is_refused_by_name(fresh_session):
    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    with ms.DeviceCtx("meta"):
        model = nn.Dense(8, 16)
    with pytest.raises(ValueError, match=r"parameter '.*weight' lives on MindSpore's meta device.*init_empty_weights"):
        fully_shard(model, mesh=mesh)


def test_on_host_runs_a_meta_context_block_on_the_host_and_leaves_other_devices_alone():
    with on_host():
        assert get_current_device().device_target == "CPU"
        assert Tensor(np.ones(2, np.float32)).device == "CPU"
    with ms.DeviceCtx("meta"):
        with on_host():
            made = Tensor(np.ones(2, np.float32))
            assert made.device == "CPU" and made.asnumpy().sum() == 2.0
        assert get_current_device().device_target == "meta"  # the caller's context again
        assert Tensor(np.ones(2, np.float32)).device == "meta"


def test_the_default_mode_inside_a_meta_context_follows_the_device_outside_it(fresh_session):
    from mindspore._c_expression import MSContext

    from mindspore_hyper.context import get_context

    assert get_context("mode") == "simulation"  # CPU, no mode set
    with ms.DeviceCtx("meta"):
        assert get_context("mode") == "simulation"  # not "native", as a non-CPU target would give
    MSContext.get_instance().set_device_target_inner("meta")  # "meta" outside any DeviceCtx block
    try:
        with pytest.raises(ValueError, match=r"mode: MindSpore's device target is 'meta'.*set mode explicitly"):
            get_context("mode")
    finally:
        MSContext.get_instance().set_device_target_inner("CPU")
    assert get_context("mode") == "simulation"
