"""DTensor.reduce_partial() (upstream's method): Partial placements summed into Replicate, Shard
kept, on the same mesh, with gradients; against numpy and one device (simulation)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, ops

from mindspore_hyper.hyper_parallel import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh

# A 4 x 8 @ 8 x 6 product whose contraction is split over 2 devices: the two partial sums (4 terms
# each, |terms| < 8) are added in another order than numpy's: below 8 * 8 * 2**-24 ~ 4e-6 absolute.
MATMUL_ATOL = 1e-5


@pytest.fixture
def mesh(fresh_session):
    fresh_session.set_context(device_num=4)
    return init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))


def test_a_row_parallel_product_reduced_keeps_its_row_split(mesh):
    rng = np.random.RandomState(0)
    x, w = rng.randn(4, 8).astype(np.float32), rng.randn(8, 6).astype(np.float32)
    dx = distribute_tensor(Tensor(x), mesh, (Shard(0), Shard(1)))  # rows over dp, contraction over tp
    dw = distribute_tensor(Tensor(w), mesh, (Replicate(), Shard(0)))
    y = ops.matmul(dx, dw)
    assert y.placements == (Shard(0), Partial("sum"))
    reduced = y.reduce_partial()
    assert reduced.placements == (Shard(0), Replicate()) and reduced.device_mesh is y.device_mesh
    assert reduced.to_local().shape == (2, 6)  # still each dp rank's half of the rows
    np.testing.assert_allclose(reduced.full_tensor().asnumpy(), x @ w, atol=MATMUL_ATOL)


def test_one_value_passed_as_partial_by_every_rank_reduces_to_its_sum(mesh):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    summed = DTensor.from_local(Tensor(x), mesh["tp"], [Partial("sum")]).reduce_partial()
    assert summed.placements == (Replicate(),)
    np.testing.assert_array_equal(summed.to_local().asnumpy(), 2 * x)  # 2 tp ranks, exact small integers
    maximum = DTensor.from_local(Tensor(x), mesh, [Partial("max"), Replicate()]).reduce_partial()
    np.testing.assert_array_equal(maximum.full_tensor().asnumpy(), x)


def test_without_partial_placements_it_is_the_same_dtensor(mesh):
    d = distribute_tensor(Tensor(np.ones((4, 4), np.float32)), mesh, (Shard(0), Replicate()))
    assert d.reduce_partial() is d


def test_gradients_flow_through_reduce_partial_as_through_one_device(mesh):
    rng = np.random.RandomState(1)
    weight = Parameter(Tensor(rng.randn(8, 6).astype(np.float32)), name="w")
    x = Tensor(rng.randn(4, 8).astype(np.float32))

    def sharded(x):
        y = ops.matmul(distribute_tensor(x, mesh, (Replicate(), Shard(1))),
                       distribute_tensor(weight * 1.0, mesh, (Replicate(), Shard(0)))).reduce_partial()
        return (ops.tanh(y) ** 2).sum()

    loss, grads = ms.value_and_grad(sharded, None, [weight])(x)
    ref_loss, ref_grads = ms.value_and_grad(lambda x: (ops.tanh(x @ weight) ** 2).sum(), None, [weight])(x)
    # float32 sums of 24 terms of size <~1, the matmul's partial sums reordered: a few ulps of the total
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    np.testing.assert_allclose(grads[0].asnumpy(), ref_grads[0].asnumpy(), rtol=1e-5, atol=1e-5)


def test_a_rank_local_value_is_refused(mesh):
    d = distribute_tensor(Tensor(np.ones((4, 4), np.float32)), mesh, (Shard(0), Replicate()))
    with pytest.raises(ValueError, match=r"reduce_partial\(\): a rank-local value .*DTensor.from_local"):
        d.to_local().reduce_partial()
