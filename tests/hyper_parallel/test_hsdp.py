"""hsdp (HyperParallel's hybrid sharded data parallel): parameters split over each one's
data-parallel group, gradients summed x grad_scale, against one device."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.hyper_parallel import (
    HSDPCell, Replicate, Shard, ShardingPlan, distribute_tensor, hsdp, init_device_mesh, laid_out_parameters,
    shard_module,
)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = Parameter(Tensor(np.random.RandomState(0).randn(16, 8).astype(np.float32)), name="weight")
        self.bias = Parameter(Tensor(np.zeros(8, np.float32)), name="bias")

    def construct(self, x):
        return ops.relu(ops.matmul(x, self.weight) + self.bias).sum()


def gradients(fn, x, model=None):
    return ms.value_and_grad(fn, None, (model or fn).trainable_params())(x)


def test_hsdp_over_the_data_parallel_group_of_tensor_parallel_parameters(fresh_session):
    fresh_session.set_context(device_num=8)
    x = Tensor(np.random.RandomState(1).randn(8, 16).astype(np.float32))
    reference_loss, reference_grads = gradients(Net(), x)
    mesh = init_device_mesh("npu", (4, 2), mesh_dim_names=("dp", "tp"))
    model = Net()
    shard_module(model, mesh, ShardingPlan(plan={"weight": (Replicate(), Shard(0))},
                                           input_plan={"input": (Shard(0), Shard(1))},
                                           output_plan={"output": (Replicate(), Replicate())}))
    model = hsdp(model, threshold=0)
    assert isinstance(model, HSDPCell) and isinstance(model, Net)
    placements = {k: v.placements for k, v in laid_out_parameters(model).items()}
    assert placements == {"weight": (Shard(0), Shard(0)), "bias": (Shard(0), Shard(0))}  # bias: dp x tp replicas split
    loss, grads = gradients(lambda x: model(distribute_tensor(x, mesh, [Shard(0), Shard(1)])), x, model)
    # a global batch: the loss is global and the gradient is its sum, as one device computes it
    np.testing.assert_allclose(float(loss), float(reference_loss), rtol=1e-5)
    for g, r in zip(grads, reference_grads):
        np.testing.assert_allclose(g.asnumpy(), r.asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options", [{"shard_size": 1, "threshold": 0}, {"threshold": 64}])
def test_parameters_hsdp_keeps_whole_take_a_global_batchs_gradient_once(fresh_session, options):
    """A Parameter hsdp leaves unsplit (shard_size=1, or under the threshold: 512 B < 64 KB) with a
    batch split over "dp" as a DTensor: the loss is global, so its gradient is one device's (the
    replicas' gradients are not summed on top; upstream's loss_repeat_mean case 2 found this)."""
    fresh_session.set_context(device_num=8)
    x = Tensor(np.random.RandomState(4).randn(8, 16).astype(np.float32))
    reference_loss, reference_grads = gradients(Net(), x)
    mesh = init_device_mesh("npu", (4, 2), mesh_dim_names=("dp", "tp"))
    model = Net()
    shard_module(model, mesh, ShardingPlan(plan={"weight": (Replicate(), Shard(0))}))
    model = hsdp(model, **options)
    assert laid_out_parameters(model)["weight"].placements == (Replicate(), Shard(0))  # not split over "dp"
    loss, grads = gradients(lambda x: model(distribute_tensor(x, mesh, [Shard(0), Shard(1)])), x, model)
    # float32 sums of <= 16 terms reordered by the split: a few ulps
    np.testing.assert_allclose(float(loss), float(reference_loss), rtol=1e-5)
    for g, r in zip(grads, reference_grads):
        np.testing.assert_allclose(g.asnumpy(), r.asnumpy(), rtol=1e-5, atol=1e-6)


def test_hsdp_sums_plain_inputs_as_that_many_equal_ranks_would(fresh_session):
    """Plain inputs are the same batch on every rank; hsdp sums the ranks' gradients (x
    grad_scale), so the gradient is group size x grad_scale x one device's, as N processes give."""
    fresh_session.set_context(device_num=4)
    x = Tensor(np.random.RandomState(2).randn(3, 16).astype(np.float32))
    _, reference_grads = gradients(Net(), x)
    init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    model = hsdp(Net(), threshold=0, grad_scale=0.5)
    _, grads = gradients(model, x)
    for g, r in zip(grads, reference_grads):
        np.testing.assert_allclose(g.asnumpy(), 4 * 0.5 * r.asnumpy(), rtol=1e-5, atol=1e-6)


def test_hsdp_threshold_shard_size_and_refusals(fresh_session):
    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("a", "b"))
    model = hsdp(Net(), threshold=1)  # 1 KB: the weight (512 B) and the bias (32 B) stay whole
    assert all(p == (Replicate(), Replicate()) for p in
               (v.placements for v in laid_out_parameters(model).values()))
    model = hsdp(Net(), shard_size=2, threshold=0)  # the innermost axis "b" only
    assert laid_out_parameters(model)["weight"].placements == (Replicate(), Shard(0))
    with pytest.raises(ValueError, match="innermost groups of \\[1, 2, 4\\]"):
        hsdp(Net(), shard_size=3, threshold=0)
    with pytest.raises(ValueError, match="optimizer_level should be in"):
        hsdp(Net(), optimizer_level="level4")
    with pytest.raises(ValueError, match="set_requires_grad_sync\\(False\\): HSDPNet was made by hsdp without "
                                         "enable_grad_accumulation=True"):
        hsdp(Net(), threshold=0).set_requires_grad_sync(False)
    with pytest.raises(ValueError, match="enable_grad_accumulation must be bool"):
        hsdp(Net(), enable_grad_accumulation=1)
    # accumulation outside and inside pipelines: test_grad_accumulation.py, pipeline_tp_script.py
    assert mesh.size() == 4


def test_hsdp_of_a_cell_on_no_mesh_is_data_parallel_over_the_whole_job(fresh_session):
    """No mesh made: upstream's hsdp uses the whole job, split groups of shard_size consecutive
    ranks. Plain inputs are the same batch on all 4 ranks, so the gradient is 4 x one device's
    (tolerance: float32 sums of 3 x 16 products, rounding a few ulp)."""
    fresh_session.set_context(device_num=4)
    x = Tensor(np.random.RandomState(3).randn(3, 16).astype(np.float32))
    _, reference_grads = gradients(Net(), x)
    model = hsdp(Net(), shard_size=2, threshold=0)
    placements = {k: v.placements for k, v in laid_out_parameters(model).items()}
    assert placements == {"weight": (Replicate(), Shard(0)), "bias": (Replicate(), Shard(0))}
    mesh = laid_out_parameters(model)["weight"].device_mesh
    assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard") and mesh.mesh.tolist() == [[0, 1], [2, 3]]
    _, grads = gradients(model, x)
    for g, r in zip(grads, reference_grads):
        np.testing.assert_allclose(g.asnumpy(), 4 * r.asnumpy(), rtol=1e-5, atol=1e-6)
    whole = hsdp(Net(), threshold=0)  # shard_size -1: one group of the whole job
    assert {k: v.placements for k, v in laid_out_parameters(whole).items()}["weight"] == (Shard(0),)
    with pytest.raises(ValueError, match="shard_size=3 does not divide the job's 4 devices"):
        hsdp(Net(), shard_size=3, threshold=0)
