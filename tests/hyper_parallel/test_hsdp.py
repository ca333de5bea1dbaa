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


def test_graph_pass_plugin_query_answers_none_and_the_graph_scheduler_refuses():
    """Upstream's tests ask the scheduler for its ms.jit graph-pass library (skipping graph cases
    without it): here there is none, and building the graph-mode scheduler is refused, named."""
    from mindspore_hyper.hyper_parallel import install_hyper_parallel
    from mindspore_hyper.hyper_parallel.refused_names import NotProvidedError

    install_hyper_parallel()
    from hyper_parallel.platform.mindspore.hsdp.scheduler import MindSporeHSDPScheduler

    assert MindSporeHSDPScheduler.get_pass_library_pass() is None
    with pytest.raises(NotProvidedError, match=r"MindSporeHSDPScheduler: .*use_eager_hook=True"):
        MindSporeHSDPScheduler(None, None)


class TwoLayers(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(8, 8), nn.Dense(8, 8)])

    def construct(self, x):
        for layer in self.layers:
            x = ops.tanh(layer(x))
        return x.sum()


def test_hsdp_prefetch_setters_record_their_cells_and_keep_the_values(fresh_session):
    """Upstream's prefetch setters choose when gathers are issued, not what they compute: here
    they record their lists, and the gradients stay bit for bit those without them (and 4 x one
    device's for the plain batch every rank gets; tolerance: float32 sums of 8-term products)."""
    fresh_session.set_context(device_num=4)
    init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    model, reference = TwoLayers(), TwoLayers()
    for mine, theirs in zip(model.get_parameters(), reference.get_parameters()):
        theirs.set_data(mine.data.copy())
    for layer in model.layers:
        hsdp(layer, 4, 0, optimizer_level="level3")
    x = Tensor(np.random.RandomState(4).randn(5, 8).astype(np.float32))
    _, before = gradients(model, x)
    model.layers[0].set_forward_prefetch_cells([model.layers[1]])
    model.layers[1].set_backward_prefetch_cells((model.layers[0],))
    assert model.layers[0].forward_prefetch == [model.layers[1]]
    assert model.layers[1].backward_prefetch == [model.layers[0]]
    _, after = gradients(model, x)
    _, reference_grads = gradients(reference, x)
    for a, b, r in zip(after, before, reference_grads):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
        np.testing.assert_allclose(a.asnumpy(), 4 * r.asnumpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="set_forward_prefetch_cells: hsdp_cell_list must be a list or tuple"):
        model.layers[0].set_forward_prefetch_cells(model.layers[1])
    with pytest.raises(ValueError, match="set_backward_prefetch_cells: .* hsdp Cells only, but got a Dense"):
        model.layers[1].set_backward_prefetch_cells([nn.Dense(2, 2)])


class HalfNet(nn.Cell):
    """A float16 model (upstream's reduce_dtype case: float16 Parameters, float32 reductions)."""

    def __init__(self):
        super().__init__()
        rng = np.random.RandomState(5)
        self.weight = Parameter(Tensor(rng.randn(16, 8).astype(np.float16)), name="weight")
        self.bias = Parameter(Tensor(rng.randn(8).astype(np.float16)), name="bias")

    def construct(self, x):
        return ops.tanh(ops.matmul(x, self.weight) + self.bias).sum()


def test_hsdp_reduce_dtype_casts_the_gradient_for_the_reduction_and_back(fresh_session):
    """float16 Parameters reduced in float32: the gradient comes back in float16 and, for the plain
    batch every simulated rank gets, is 4 x one device's exactly (4 equal float16 values add up
    exactly in float32 and x 4 is exact in float16); a float32 Parameter is left as it is. Under
    msrun each rank's own float16 gradient is summed in float32 (rank_checks.py)."""
    fresh_session.set_context(device_num=4)
    x = Tensor(np.random.RandomState(6).randn(3, 16).astype(np.float16))
    _, reference_grads = gradients(HalfNet(), x)
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    model = hsdp(HalfNet(), threshold=0, reduce_dtype=ms.float32)
    assert model.fsdp_state.reduce_dtype is ms.float32
    _, grads = gradients(model, x)
    for g, r in zip(grads, reference_grads):
        assert g.dtype == ms.float16
        np.testing.assert_array_equal(g.asnumpy(), 4 * r.asnumpy())
    _, plain = gradients(hsdp(HalfNet(), threshold=0), x)
    for g, p in zip(grads, plain):
        np.testing.assert_array_equal(g.asnumpy(), p.asnumpy())
    single = hsdp(Net(), threshold=0, reduce_dtype=ms.float32)  # float32 Parameters: nothing to cast
    _, grads32 = gradients(single, Tensor(np.ones((2, 16), np.float32)))
    assert all(g.dtype == ms.float32 for g in grads32)
    with pytest.raises(ValueError, match="reduce_dtype must be a floating mindspore dtype .* but got 'float32'"):
        hsdp(HalfNet(), reduce_dtype="float32")
    with pytest.raises(ValueError, match=r"hsdp\(reduce_dtype=Float32\): the inputs are DTensors split over the "
                                         r"data-parallel mesh .* 'weight' .* in Float16"):
        gradients(lambda v: model(distribute_tensor(v, mesh, [Shard(0)])), x, model)


def test_mindspores_own_dry_run_is_refused_at_the_first_mesh(fresh_session, monkeypatch):
    """Upstream's dry-run tests set MS_SIMULATION_LEVEL=1 (MindSpore launches no kernels): no
    value would be computed, so the first mesh refuses it, naming the variable and this test."""
    fresh_session.set_context(device_num=4)
    monkeypatch.setenv("MS_SIMULATION_LEVEL", "1")
    with pytest.raises(RuntimeError, match=r"test_hsdp\.py:\d+: MS_SIMULATION_LEVEL=1 is MindSpore's own dry run"):
        hsdp(HalfNet(), threshold=0)
    monkeypatch.setenv("MS_SIMULATION_LEVEL", "0")
    assert isinstance(hsdp(HalfNet(), threshold=0), HSDPCell)


def test_a_parameters_own_hsdp_shard_size_takes_the_cells_place(fresh_session):
    """Upstream's `param.hsdp_shard_size`: that Parameter is split over so many devices (the
    innermost axes giving it), the others by the Cell's shard_size; bad values refused, named."""
    fresh_session.set_context(device_num=4)
    init_device_mesh("npu", (2, 2), mesh_dim_names=("a", "b"))
    net = Net()
    net.weight.hsdp_shard_size = 2
    model = hsdp(net, threshold=0)
    placements = {k: v.placements for k, v in laid_out_parameters(model).items()}
    assert placements == {"weight": (Replicate(), Shard(0)), "bias": (Shard(0), Shard(0))}
    assert (net.weight.hsdp_effective_shard_size, net.bias.hsdp_effective_shard_size) == (2, 4)
    x = Tensor(np.random.RandomState(7).randn(3, 16).astype(np.float32))
    _, grads = gradients(model, x)
    _, reference_grads = gradients(Net(), x)
    for g, r in zip(grads, reference_grads):  # 4 equal ranks summed (float32 sums of 3 x 16 products)
        np.testing.assert_allclose(g.asnumpy(), 4 * r.asnumpy(), rtol=1e-5, atol=1e-6)
    for bad in (0, 2.0, True):
        odd = Net()
        odd.bias.hsdp_shard_size = bad
        with pytest.raises(ValueError, match=f"parameter 'bias'.s hsdp_shard_size must be a positive integer or -1, "
                                             f"but got {bad!r}"):
            hsdp(odd, threshold=0)
    odd = Net()
    odd.weight.hsdp_shard_size = 3
    with pytest.raises(ValueError, match=r"hsdp\(shard_size=3\): parameter 'weight'.s .* \[1, 2, 4\]"):
        hsdp(odd, threshold=0)
