"""DTensor API and the simulated collectives (against numpy references, with gradients)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindspore_hyper.shard import Layout, TensorLayout
from mindspore_hyper.shard.reference_executor import reduce_arrays
from mindspore_hyper.runtime.simulation import DTensor, distribute_tensor
from mindspore_hyper.dtensor.accounting import Accounting, use_accounting
from mindspore_hyper.comm.inprocess_collectives import InProcessCollectives as SimCollectives

MESH = Layout((2, 2, 2), ("data", "tensor", "pipeline"))
RNG = np.random.default_rng(7)


def test_distribute_local_shards_and_full_tensor():
    g = RNG.standard_normal((4, 8, 6)).astype(np.float32)
    layout = MESH("tensor", None, "pipeline")
    dt = distribute_tensor(Tensor(g), layout)
    assert isinstance(dt, DTensor) and dt.shape == (4, 8, 6) and dt.layout == layout
    assert len(dt.shards) == 4  # 'data' replicas share one shard object
    for rank in range(8):
        np.testing.assert_array_equal(dt.local_shard(rank).asnumpy(), g[layout.rank_slices(rank, g.shape)])
    assert dt.local_shard(0) is dt.local_shard(4)
    np.testing.assert_array_equal(dt.full_tensor().asnumpy(), g)
    text = repr(dt)
    assert "shape=(4, 8, 6)" in text and "shard_shape=(2, 8, 3)" in text and "'tensor'" in text


def test_redistribute_executes_plan_and_records_comm():
    g = RNG.standard_normal((8, 4)).astype(np.float32)
    acc = Accounting(8)
    with use_accounting(acc):
        dt = distribute_tensor(Tensor(g), MESH("data", None))
        moved = dt.redistribute(MESH(None, "data"))
    for rank in range(8):
        np.testing.assert_array_equal(moved.local_shard(rank).asnumpy(), g[MESH(None, "data").rank_slices(rank, g.shape)])
    assert dict(acc.comm) == {("AllToAll", "data"): [1, 4 * 4 * 4 // 2, 4 * 4 * 4]}


def test_partial_layout_and_full_tensor_reduces():
    g = RNG.standard_normal((4, 4)).astype(np.float32)
    partial = TensorLayout(MESH, (None, None), partial={"tensor": "sum"})
    dt = distribute_tensor(Tensor(g), partial)
    assert np.abs(dt.local_shard(2).asnumpy()).max() == 0  # tensor coordinate 1 holds zeros
    np.testing.assert_allclose(dt.full_tensor().asnumpy(), g)


def test_full_tensor_is_differentiable():
    g = Tensor(RNG.standard_normal((8, 4)).astype(np.float32))

    def f(x):
        dt = distribute_tensor(x, MESH(("data", "tensor"), "pipeline"))
        return (dt * dt).full_tensor().sum()

    grad = ms.grad(f)(g)
    np.testing.assert_allclose(grad.asnumpy(), 2 * g.asnumpy(), rtol=1e-6)


def test_distribute_splits_indivisible_dimensions_as_torch_chunk():
    """3 rows over "data" x "tensor" (2 x 2, nested): 2, 1 over data, then 1, 1 and 1, 0 over tensor."""
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    dt = distribute_tensor(Tensor(x), MESH(("data", "tensor"), None))
    rows = {r: dt.local_shard(r).shape[0] for r in MESH.ranks}
    assert [rows[MESH.rank_at((d, t, 0))] for d in range(2) for t in range(2)] == [1, 1, 1, 0]
    np.testing.assert_array_equal(dt.asnumpy(), x)
    with pytest.raises(ValueError, match="has 2 dimensions but the tensor map"):
        distribute_tensor(Tensor(x), MESH("data"))


def test_ops_on_dtensors_of_different_meshes_fail_clearly():
    other = Layout((8,), ("dp",))
    a = distribute_tensor(Tensor(np.ones((8, 4), np.float32)), MESH("data", None))
    b = distribute_tensor(Tensor(np.ones((8, 4), np.float32)), other("dp", None))
    with pytest.raises(ValueError, match="different meshes"):
        a + b


def test_getitem_keeps_whole_dims_sharded():
    g = RNG.standard_normal((8, 6)).astype(np.float32)
    dt = distribute_tensor(Tensor(g), MESH("data", None))
    sub = dt[:, 1:4]
    assert sub.layout.tensor_map == ("data", None)
    np.testing.assert_array_equal(sub.full_tensor().asnumpy(), g[:, 1:4])
    np.testing.assert_array_equal(dt[3].full_tensor().asnumpy(), g[3])


# -- collectives -----------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_all_reduce(op):
    arrays = [RNG.standard_normal((3, 5)).astype(np.float32) for _ in range(4)]
    outs = SimCollectives().all_reduce([Tensor(a) for a in arrays], op)
    for out in outs:
        np.testing.assert_allclose(out.asnumpy(), reduce_arrays(arrays, op), rtol=1e-6)


def test_all_gather_reduce_scatter_all_to_all_broadcast():
    c = SimCollectives()
    arrays = [RNG.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]
    tensors = [Tensor(a) for a in arrays]
    np.testing.assert_array_equal(c.all_gather(tensors, 1)[1].asnumpy(), np.concatenate(arrays, 1))
    rs = c.reduce_scatter(tensors, 0, "sum")
    total = arrays[0] + arrays[1]
    np.testing.assert_allclose(rs[0].asnumpy(), total[:2], rtol=1e-6)
    np.testing.assert_allclose(rs[1].asnumpy(), total[2:], rtol=1e-6)
    a2a = c.all_to_all(tensors, split_dim=1, concat_dim=0)
    np.testing.assert_array_equal(a2a[1].asnumpy(), np.concatenate([arrays[0][:, 3:], arrays[1][:, 3:]], 0))
    assert c.broadcast(tensors, root=1)[0] is tensors[1]


def test_collectives_are_differentiable():
    c = SimCollectives()
    x = Tensor(RNG.standard_normal((4, 4)).astype(np.float32))

    def f(x):
        members = [x, x * 2.0]
        outs = c.reduce_scatter(c.all_to_all(members, 0, 1), 1, "sum")
        return sum(o.sum() for o in outs) + c.all_reduce(members, "max")[0].sum()

    grad = ms.grad(f)(x)
    # reduce_scatter(all_to_all) of [x, 2x] sums every element of both: d/dx = 1 + 2;
    # max(x, 2x) = 2x where x > 0 else x
    expected = 3.0 + np.where(x.asnumpy() > 0, 2.0, 1.0)
    np.testing.assert_allclose(grad.asnumpy(), expected, rtol=1e-6)
