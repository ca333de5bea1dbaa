"""`Parameter(dtensor)`: a weight made from a DTensor (upstream's `loss_repeat_mean` form and
MindFormers' `_distribute_param`) trains equal to one device; the cases it refuses."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, mint, nn

from mindspore_hyper.hyper_parallel import (
    DTensor, Partial, Replicate, Shard, ShardingPlan, distribute_tensor, hsdp, init_device_mesh,
    laid_out_parameters, parallelize_value_and_grad, shard_module,
)

IN, OUT, BATCH = 8, 2, 4
# The same float32 matmul/relu/Adam on the same values; the parallel run sums the matmul's IN terms
# in per-shard pieces and the gradient's BATCH terms in per-shard pieces: relative error
# ~ (IN + BATCH) * 2^-24 ~ 1e-6 (and Adam's update divides by sqrt(v) + eps, which keeps it relative).
RTOL, ATOL = 1e-5, 1e-6


class SimpleModel(nn.Cell):
    """relu(x @ weight); the weight a plain Parameter, or `Parameter(DTensor)` when a mesh is given."""

    def __init__(self, weight: np.ndarray, mesh=None, placements=None, from_local=True):
        super().__init__()
        if mesh is None:
            self.weight = Parameter(Tensor(weight), name="weight")
        elif from_local:  # upstream's loss_repeat_mean: each rank's local block (here: the same on all)
            self.weight = Parameter(DTensor.from_local(Tensor(weight), mesh, placements), name="weight")
        else:  # MindFormers' _distribute_param: the global value, distributed
            self.weight = Parameter(distribute_tensor(Tensor(weight), mesh, placements), name="weight",
                                    requires_grad=True)
        self.relu = mint.nn.ReLU()

    def construct(self, x):
        return self.relu(mint.matmul(x, self.weight))


def _train(model, x, grad_fn_of, steps=2):
    optimizer = nn.Adam(model.trainable_params(), learning_rate=0.01)
    grad_fn = grad_fn_of(lambda data: model(data).sum(), optimizer.parameters)
    losses = []
    for _ in range(steps):
        loss, grads = grad_fn(x)
        optimizer(grads)
        losses.append(float(loss.full_tensor().asnumpy() if isinstance(loss, DTensor) else loss.asnumpy()))
    return losses, model.weight


def _standalone(weight, x):
    return _train(SimpleModel(weight), Tensor(x), lambda f, w: ms.value_and_grad(f, None, w))


@pytest.mark.parametrize("use_hsdp", [False, True], ids=["shard_module", "shard_module+hsdp"])
def test_parameter_from_local_dtensor_trains_equal_to_one_device(fresh_session, use_hsdp):
    """Upstream's loss_repeat_mean on a 2 x 2 mesh: the weight `Parameter(DTensor.from_local(ones
    block, mesh, (Replicate(), Shard(0))))`, x split over both mesh dims, relu's input and output
    planned; 2 Adam steps equal one device (the global weight is the blocks concatenated)."""
    fresh_session.set_context(device_num=4)
    rng = np.random.RandomState(0)
    block = rng.randn(IN // 2, OUT).astype(np.float32)
    x = rng.randn(BATCH, IN).astype(np.float32)
    want_losses, want_weight = _standalone(np.concatenate([block, block]), x)

    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "mp"))
    model = SimpleModel(block, mesh, (Replicate(), Shard(0)))
    assert model.weight.name == "weight" and tuple(model.weight.shape) == (IN, OUT)
    shard_module(model, device_mesh=mesh, sharding_plan=ShardingPlan(input_plan={"input": ((Shard(0), Shard(1)),)}))
    shard_module(model.relu, device_mesh=mesh, sharding_plan=ShardingPlan(
        input_plan={"input": ((Shard(0), Replicate()),)}, output_plan={"output": ((Shard(0), Replicate()),)}))
    if use_hsdp:
        model = hsdp(model, shard_size=2, threshold=0)
    assert laid_out_parameters(model)["weight"].placements[1] == Shard(0)
    got_losses, got_weight = _train(model, distribute_tensor(Tensor(x), mesh, (Shard(0), Shard(1))),
                                    parallelize_value_and_grad)
    np.testing.assert_allclose(got_losses, want_losses, rtol=RTOL)
    np.testing.assert_allclose(got_weight.asnumpy(), want_weight.asnumpy(), rtol=RTOL, atol=ATOL)


def test_parameter_from_distributed_tensor_trains_equal_to_one_device(fresh_session):
    """MindFormers' form: `Parameter(distribute_tensor(w, mesh, (Shard(1),)), name=, requires_grad=)`
    set on a Cell that `shard_module` lays out; the weight is column-split and 2 Adam steps equal one
    device."""
    fresh_session.set_context(device_num=2)
    rng = np.random.RandomState(1)
    weight = rng.randn(IN, OUT).astype(np.float32)
    x = rng.randn(BATCH, IN).astype(np.float32)
    want_losses, want_weight = _standalone(weight, x)

    mesh = init_device_mesh("npu", (2,), mesh_dim_names=("tp",))
    model = SimpleModel(weight, mesh, (Shard(1),), from_local=False)
    shard_module(model, device_mesh=mesh, sharding_plan=ShardingPlan(input_plan={"input": ((Replicate(),),)}))
    assert laid_out_parameters(model)["weight"].placements == (Shard(1),)
    got_losses, got_weight = _train(model, Tensor(x), parallelize_value_and_grad)
    np.testing.assert_allclose(got_losses, want_losses, rtol=RTOL)
    np.testing.assert_allclose(got_weight.asnumpy(), want_weight.asnumpy(), rtol=RTOL, atol=ATOL)


def test_parameter_of_a_partial_or_rank_local_dtensor_is_refused(fresh_session):
    """A Partial DTensor holds pending sums, a rank-local value (to_local() of a split DTensor in
    simulation) has no layout: neither can be a Parameter's value."""
    fresh_session.set_context(device_num=2)
    mesh = init_device_mesh("npu", (2,), mesh_dim_names=("tp",))
    partial = DTensor.from_local(Tensor(np.ones((2, 2), np.float32)), mesh, (Partial(),))
    with pytest.raises(ValueError, match="Partial"):
        Parameter(partial, name="w")
    split = distribute_tensor(Tensor(np.arange(4, dtype=np.float32).reshape(2, 2)), mesh, (Shard(0),))
    with pytest.raises(ValueError, match="rank-local"):
        Parameter(split.to_local(), name="w")
