"""DTensor.from_local / to_local / full_tensor / redistribute, distribute_tensor and factories,
against numpy (torch's semantics: each rank's local tensor is its shard)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, ops

from mindspore_hyper.hyper_parallel import (
    DTensor, Partial, Replicate, Shard, SkipDTensorDispatch, distribute_tensor, full, init_device_mesh, ones,
    parallelize_value_and_grad, rand, zeros,
)


@pytest.fixture
def mesh(fresh_session):
    fresh_session.set_context(device_num=4)
    return init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))


def values(rows=4, cols=6):
    return np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) / 7.0


def test_from_local_of_one_value_is_what_every_rank_passing_it_makes(mesh):
    x = values()
    sharded = DTensor.from_local(Tensor(x), mesh, [Shard(0), Replicate()])
    assert sharded.shape == (8, 6) and sharded.placements == (Shard(0), Replicate())
    np.testing.assert_array_equal(sharded.full_tensor().asnumpy(), np.concatenate([x, x]))
    partial = DTensor.from_local(Tensor(x), mesh, [Replicate(), Partial("sum")])
    np.testing.assert_allclose(partial.full_tensor().asnumpy(), 2 * x, rtol=1e-7)
    averaged = DTensor.from_local(Tensor(x), mesh, [Partial("avg"), Replicate()])
    np.testing.assert_allclose(averaged.full_tensor().asnumpy(), x, rtol=1e-6)
    with pytest.raises(ValueError, match=r"local shapes do not lay out shape=\(7, 6\).*rank 2 has \(4, 6\), "
                                         r"expected \(3, 6\)"):  # uneven pieces: test_uneven_shards.py
        DTensor.from_local(Tensor(x), mesh, [Shard(0), Replicate()], shape=(7, 6))


def test_to_local_gives_each_rank_its_shard_and_from_local_reassembles(mesh):
    x = values(4, 8)
    d = distribute_tensor(Tensor(x), mesh, [Shard(0), Shard(1)])
    local = d.to_local()
    assert local.shape == (2, 4) and local.layout.is_rank_local
    for rank in range(4):
        dp, tp = divmod(rank, 2)
        np.testing.assert_array_equal(local.local_shard(rank).asnumpy(), x[dp * 2:(dp + 1) * 2, tp * 4:(tp + 1) * 4])
    # ops on rank-local values run on each rank's own tensor
    doubled = ops.exp(local) * 2.0 + 1.0
    assert doubled.shape == (2, 4) and doubled.layout.is_rank_local
    back = DTensor.from_local(doubled, mesh, [Shard(0), Shard(1)])
    # the same elementwise kernels as one device (a SIMD tail may round differently: a few ulps)
    expected = (ops.exp(Tensor(x)) * 2.0 + 1.0).asnumpy()
    np.testing.assert_allclose(back.full_tensor().asnumpy(), expected, rtol=4 * np.finfo(np.float32).eps)
    with pytest.raises(ValueError, match="differ along mesh dimension 'tp'"):
        DTensor.from_local(doubled, mesh, [Shard(0), Replicate()])
    with pytest.raises(ValueError, match="no global value"):
        local.full_tensor()
    replicated = distribute_tensor(Tensor(x), mesh, [Replicate(), Replicate()])
    plain = replicated.to_local()
    assert not isinstance(plain, DTensor)
    np.testing.assert_array_equal(plain.asnumpy(), x)


def test_redistribute_between_placements(mesh):
    x = values(4, 8)
    d = distribute_tensor(Tensor(x), mesh, [Shard(0), Shard(1)])
    for placements in ([Replicate(), Replicate()], [Shard(1), Shard(0)], [Replicate(), Shard(1)]):
        moved = d.redistribute(mesh, placements)
        assert moved.placements == tuple(placements)
        np.testing.assert_array_equal(moved.full_tensor().asnumpy(), x)
    partial = DTensor.from_local(Tensor(x), mesh, [Partial("sum"), Replicate()])
    np.testing.assert_allclose(partial.redistribute(mesh, [Shard(0), Replicate()]).full_tensor().asnumpy(), 2 * x,
                               rtol=1e-7)
    on_tp = d.redistribute(mesh["tp"], [Shard(0)])
    assert on_tp.device_mesh == mesh["tp"] and on_tp.placements == (Shard(0),)


def test_mixing_a_rank_local_value_with_a_sharded_dtensor_is_refused(mesh):
    d = distribute_tensor(Tensor(values(4, 8)), mesh, [Shard(0), Shard(1)])
    with pytest.raises(ValueError, match="mixes a rank-local tensor"):
        d.to_local() + d


def test_factories_and_random_values_are_one_global_tensor(mesh):
    np.testing.assert_array_equal(zeros(4, 6, device_mesh=mesh, placements=[Shard(0), Shard(1)]).full_tensor().asnumpy(),
                                  np.zeros((4, 6), np.float32))
    np.testing.assert_array_equal(ones((4, 6), device_mesh=mesh).full_tensor().asnumpy(), np.ones((4, 6), np.float32))
    np.testing.assert_array_equal(full((2, 2), 3.5, device_mesh=mesh, placements=[Replicate(), Shard(1)])
                                  .full_tensor().asnumpy(), np.full((2, 2), 3.5, np.float32))
    ms.set_seed(3)
    drawn = rand(8, 4, device_mesh=mesh, placements=[Shard(0), Replicate()])
    ms.set_seed(3)
    np.testing.assert_array_equal(drawn.full_tensor().asnumpy(), ops.rand((8, 4)).asnumpy())
    with pytest.raises(ValueError, match="requires_grad=True"):
        zeros(2, 2, device_mesh=mesh, requires_grad=True)


def test_gradients_flow_through_from_local_and_to_local(mesh):
    rng = np.random.RandomState(0)
    weight = Parameter(Tensor(rng.randn(6, 4).astype(np.float32)), name="w")
    x = Tensor(rng.randn(4, 6).astype(np.float32))

    def sharded(x):
        dx = DTensor.from_local(x, mesh["dp"], [Replicate()])
        dw = distribute_tensor(weight * 1.0, mesh, [Replicate(), Shard(1)])
        out = (dx @ dw).to_local()  # each tp rank's columns of the product
        return (ops.tanh(out) ** 2).sum()  # a rank-local scalar per tp rank ...

    def reduced(x):
        per_rank = sharded(x)
        return DTensor.from_local(per_rank, mesh, [Replicate(), Partial("sum")]).full_tensor()  # ... summed

    loss, grads = ms.value_and_grad(reduced, None, [weight])(x)
    ref_loss, ref_grads = ms.value_and_grad(lambda x: (ops.tanh(x @ weight) ** 2).sum(), None, [weight])(x)
    # float32 sums of 30 terms of size <~1: a few ulps of the total
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    np.testing.assert_allclose(grads[0].asnumpy(), ref_grads[0].asnumpy(), rtol=1e-5, atol=1e-6)


def test_parallelize_value_and_grad_differentiates_the_global_value(mesh):
    weight = Parameter(Tensor(values(6, 4)), name="w")
    x = Tensor(values(4, 6))

    def fn(x):
        dw = distribute_tensor(weight * 1.0, mesh, [Replicate(), Shard(1)])
        out = DTensor.from_local(x, mesh, [Replicate(), Replicate()]) @ dw
        return out.sum(), out

    (loss, out), grads = parallelize_value_and_grad(fn, [weight])(x)
    assert isinstance(out, Tensor) and out.shape == (4, 4)
    np.testing.assert_allclose(float(loss), float((x @ weight).sum()), rtol=1e-6)
    expected = np.broadcast_to(x.asnumpy().sum(0)[:, None], (6, 4))
    np.testing.assert_allclose(grads[0].asnumpy(), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="sens has 1 entries for 2 outputs"):
        parallelize_value_and_grad(fn, [weight], sens=[1.0])(x)


def test_skip_dtensor_dispatch_runs_ops_on_the_local_parts(mesh):
    x = values(4, 8)
    d = distribute_tensor(Tensor(x), mesh, [Shard(0), Shard(1)])
    with SkipDTensorDispatch():
        local_sum = d.sum()  # each rank sums its own shard
    assert local_sum.layout.is_rank_local and local_sum.shape == ()
    np.testing.assert_allclose(float(local_sum.local_shard(3).asnumpy()), x[2:, 4:].sum(), rtol=1e-6)
    assert d.sum().shape == ()  # outside the block: the global sum
    np.testing.assert_allclose(float(d.sum()), x.sum(), rtol=1e-6)


def test_a_parameter_read_by_rank_local_work_is_refused(mesh):
    weight = Parameter(Tensor(values(8, 2)), name="plain_weight")
    d = distribute_tensor(Tensor(values(4, 8)), mesh, [Replicate(), Shard(0)])
    with pytest.raises(ValueError, match="Parameter 'plain_weight' is read by rank-local work"):
        ops.matmul(d.to_local(), weight)


def test_value_and_grad_of_dtensor_outputs_differentiates_their_global_value(mesh):
    weight = Parameter(Tensor(values(6, 4)), name="w")
    x = Tensor(values(4, 6))

    def loss_fn(x):  # a DTensor scalar: without the route MindSpore's gradient would be all zeros
        dw = distribute_tensor(weight * 1.0, mesh, [Replicate(), Shard(1)])
        return (DTensor.from_local(x, mesh, [Replicate(), Replicate()]) @ dw).sum()

    loss, grads = ms.value_and_grad(loss_fn, None, [weight])(x)
    np.testing.assert_allclose(float(loss), float((x @ weight).sum()), rtol=1e-6)
    np.testing.assert_allclose(grads[0].asnumpy(), np.broadcast_to(x.asnumpy().sum(0)[:, None], (6, 4)), rtol=1e-6)

    class Returns(ms.nn.Cell):
        def construct(self, x):
            return loss_fn(x)

    with pytest.raises(ValueError, match="the Cell returned a DTensor"):
        ms.value_and_grad(Returns(), None, [weight])(x)
    local = lambda x: distribute_tensor(weight * 1.0, mesh, [Shard(0), Replicate()]).to_local().sum()  # noqa: E731
    with pytest.raises(ValueError, match="returned a rank-local tensor"):
        ms.value_and_grad(local, None, [weight])(x)
    # the executor is usable after the refusals
    np.testing.assert_allclose(ms.value_and_grad(loss_fn, None, [weight])(x)[1][0].asnumpy(), grads[0].asnumpy())


def test_a_plain_operand_is_a_global_value_so_mismatched_shapes_are_refused(mesh):
    """Per shard, a (8,) DTensor split 4 ways and a plain (2,) tensor have equal local shapes;
    globally they do not broadcast, and one device would refuse them: so must the DTensor op."""
    d = distribute_tensor(Tensor(np.arange(8, dtype=np.float32)), mesh["tp"], [Shard(0)])
    with pytest.raises(Exception, match="do not broadcast"):
        d * Tensor(np.ones(4, np.float32))
    np.testing.assert_array_equal((d * Tensor(np.full(8, 2.0, np.float32))).full_tensor().asnumpy(),
                                  np.arange(8) * 2.0)
