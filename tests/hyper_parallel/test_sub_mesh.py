"""Meshes smaller than the job: a DeviceMesh on some of the job's ranks, and init_device_mesh
tiling the job with copies of a smaller mesh (upstream's meaning), in simulation."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.hyper_parallel import (
    ColwiseParallel, DeviceMesh, Partial, Replicate, RowwiseParallel, Shard, distribute_tensor, init_device_mesh,
    parallelize_module,
)
from mindspore_hyper.hyper_parallel.report import format_report, session_report

# A 4 x 8 @ 8 x 4 product summed over 2 or 4 shards of the contraction: float32 rounding of a
# reordered sum of 8 terms of size <= 64 is below 64 * 8 * 2**-24 ~ 3e-5 absolute.
MATMUL_ATOL = 1e-4


def test_dtensor_ops_on_four_of_eight_ranks_equal_numpy_and_count_only_those_devices(fresh_session):
    fresh_session.set_context(device_num=8)
    mesh = DeviceMesh("cpu", [[4, 5], [6, 7]], mesh_dim_names=("dp", "tp"))
    rng = np.random.RandomState(0)
    x, w = rng.randn(4, 8).astype(np.float32), rng.randn(8, 4).astype(np.float32)
    dx = distribute_tensor(Tensor(x), mesh, (Shard(0), Shard(1)))
    dw = distribute_tensor(Tensor(w), mesh, (Replicate(), Shard(0)))
    assert dx.to_local().shape == (2, 4)  # each of the 4 devices holds a quarter
    y = ops.matmul(dx, dw)  # Partial over "tp": one AllReduce among the mesh's devices
    np.testing.assert_allclose(y.full_tensor().asnumpy(), x @ w, atol=MATMUL_ATOL)
    np.testing.assert_allclose(ops.relu(y).redistribute(mesh, (Replicate(), Replicate())).to_local().asnumpy(),
                               np.maximum(x @ w, 0), atol=MATMUL_ATOL)
    # models other tests left alive in this process are listed too: pick this mesh by its devices
    (entry,) = [e for e in session_report("simulation", 8)["meshes"] if e.get("ranks") == [4, 5, 6, 7]]
    assert entry["shape"] == [2, 2]
    # per device: x's quarter (2 x 4 floats) and w's half (4 x 4 floats) at least, never the 8 devices' sum
    assert 2 * 4 * 4 + 4 * 4 * 4 <= entry["peak_bytes_per_device"] < (4 * 8 + 8 * 4) * 4
    assert any(r["kind"] == "AllReduce" and r["axis"] == "tp" for r in entry["collectives"])
    assert "mesh dp=2 x tp=2 on ranks [4, 5, 6, 7]" in format_report(session_report("simulation", 8))


class Mlp(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Dense(8, 16), nn.Dense(16, 8)

    def construct(self, x):
        return self.down(ops.tanh(self.up(x)))


def test_tensor_parallel_on_a_tiled_mesh_trains_like_one_device(fresh_session):
    """init_device_mesh((2,)) in an 8-device job: 4 copies of a 2-device "tp" mesh (upstream:
    rank r gets ranks r - r % 2, r - r % 2 + 1). The simulation runs copy 0; every copy computes
    the same values, so this equals one device."""
    fresh_session.set_context(device_num=8)
    ms.set_seed(3)
    model, reference = Mlp(), Mlp()
    for (_, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        q.set_data(Tensor(p.asnumpy()))
    mesh = init_device_mesh("npu", (2,), mesh_dim_names=("tp",))
    assert mesh.copies == 4 and mesh.members == (0, 1)
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    rng = np.random.RandomState(1)
    x, y = Tensor(rng.randn(3, 8).astype(np.float32)), Tensor(rng.randn(3, 8).astype(np.float32))

    def losses(m):
        opt = nn.Adam(m.trainable_params(), learning_rate=1e-2)
        grad_fn = ms.value_and_grad(lambda a, b: ((m(a) - b) ** 2).mean(), None, opt.parameters)
        out = []
        for _ in range(3):
            loss, grads = grad_fn(x, y)
            opt(grads)
            out.append(float(loss))
        return out

    # float32: the sharded and whole sums of 16 terms differ by rounding only (~1e-7 relative)
    np.testing.assert_allclose(losses(model), losses(reference), rtol=1e-5)
    for (name, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), atol=1e-5, err_msg=name)  # 3 Adam steps of lr 1e-2
    (entry,) = [m for m in session_report("simulation", 8)["meshes"] if m["source"] == "HyperParallel API"]
    assert entry["shape"] == [2] and entry["ranks"] == [0, 1]


def test_two_meshes_on_other_devices_are_not_mixed(fresh_session):
    fresh_session.set_context(device_num=8)
    low = DeviceMesh("cpu", [0, 1, 2, 3], mesh_dim_names=("tp",))
    high = DeviceMesh("cpu", [4, 5, 6, 7], mesh_dim_names=("tp",))
    a = distribute_tensor(Tensor(np.ones((4, 4), np.float32)), low, (Shard(0),))
    b = distribute_tensor(Tensor(np.ones((4, 4), np.float32)), high, (Shard(0),))
    assert a.execution is not b.execution
    with pytest.raises(ValueError, match=r"other devices than this DTensor's mesh.*upstream requires the same rank "
                                         r"list too\): take its value with \.full_tensor\(\).*distribute_tensor"):
        a.redistribute(high, (Replicate(),))
    with pytest.raises(ValueError, match="meshes on different devices"):
        a + b


def test_redistribution_onto_a_mesh_of_another_shape_over_the_same_devices(fresh_session):
    """Upstream's redistribute.py `test_different_mesh` case (the same 8 devices as a (1, 8) and a
    (1, 8, 1) mesh), then 2x2 -> 4, 4 -> 2x2 from Partial and a mesh of reversed rank order:
    gathered to Replicate on the source mesh, sliced on the target; every rank's piece equals numpy."""
    fresh_session.set_context(device_num=8)
    dst = init_device_mesh("npu", (1, 8, 1), mesh_dim_names=("dp", "tp", "sp"))
    src = init_device_mesh("npu", (1, 8), mesh_dim_names=("dp", "tp"))
    x = distribute_tensor(Tensor(np.ones((8, 8), np.float32)), src, (Replicate(), Replicate()))
    out = x.redistribute(dst, (Replicate(), Shard(1), Replicate()))
    assert out.device_mesh == dst and out.placements == (Replicate(), Shard(1), Replicate())
    for rank in range(8):
        np.testing.assert_array_equal(out.local_shard(rank).asnumpy(), np.ones((8, 1), np.float32))

    fresh_session.set_context(device_num=4)
    square = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    line = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
    reversed_line = DeviceMesh("cpu", [3, 2, 1, 0], mesh_dim_names=("r",))
    g = np.arange(48, dtype=np.float32).reshape(8, 6)
    d = distribute_tensor(Tensor(g), square, (Shard(0), Shard(1)))
    on_line = d.redistribute(line, (Shard(0),))
    for rank in range(4):  # exact: values are only moved
        np.testing.assert_array_equal(on_line.local_shard(rank).asnumpy(), g[2 * rank:2 * rank + 2])
    on_reversed = on_line.redistribute(reversed_line, [Shard(1)])
    for position, rank in enumerate([3, 2, 1, 0]):  # position i holds torch.chunk i of 6 columns: 2, 2, 2, 0
        bounds = [(0, 2), (2, 4), (4, 6), (6, 6)][position]
        np.testing.assert_array_equal(on_reversed.local_shard(rank).asnumpy(), g[:, slice(*bounds)])
    partial = distribute_tensor(Tensor(g), line, (Replicate(),)).redistribute(line, (Partial("sum"),))
    back = partial.redistribute(square, (Replicate(), Shard(1)))  # the Partial reduced on the way
    np.testing.assert_array_equal(back.full_tensor().asnumpy(), g)
    np.testing.assert_array_equal(back.local_shard(1).asnumpy(), g[:, 3:])
    # the cost is what it does: gathers on the source mesh, nothing on a mesh that is only a target
    meshes = session_report("simulation", 4)["meshes"]
    (source,) = [e for e in meshes if e["dim_names"] == ["dp", "tp"] and e["shape"] == [2, 2]]
    assert {(r["kind"], r["axis"]) for r in source["collectives"]} == {("AllGather", "dp"), ("AllGather", "tp")}
    (target,) = [e for e in meshes if e["dim_names"] == ["r"]]
    assert not target["collectives"]
    with pytest.raises(ValueError, match=r"another mesh than this DTensor's; pass placements="):
        d.redistribute(line)


def test_a_move_onto_another_mesh_is_differentiable(fresh_session):
    """Gradient of sum(tanh(redistributed) * c) w.r.t. the source value, 2x2 -> 4 and back,
    against MindSpore on one device (float32, elementwise: a few ulps)."""
    fresh_session.set_context(device_num=4)
    square = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    line = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
    rng = np.random.RandomState(3)
    weight = ms.Parameter(Tensor(rng.randn(8, 6).astype(np.float32)), name="w")
    c = Tensor(rng.randn(8, 6).astype(np.float32))

    def sharded():
        d = distribute_tensor(weight * 1.0, square, (Shard(0), Shard(1)))
        moved = d.redistribute(line, (Shard(1),)).redistribute(square, (Replicate(), Shard(0)))
        return (ops.tanh(moved) * distribute_tensor(c, square, (Replicate(), Shard(0)))).sum().full_tensor()

    loss, grads = ms.value_and_grad(sharded, None, [weight])()
    ref_loss, ref_grads = ms.value_and_grad(lambda: (ops.tanh(weight) * c).sum(), None, [weight])()
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)  # 48 float32 terms summed in another order
    np.testing.assert_allclose(grads[0].asnumpy(), ref_grads[0].asnumpy(), rtol=1e-6, atol=1e-7)


def test_a_source_rank_outside_the_group_is_refused(fresh_session):
    fresh_session.set_context(device_num=8)
    mesh = init_device_mesh("npu", (4, 2), mesh_dim_names=("dp", "tp"))
    with pytest.raises(ValueError, match=r"src_data_rank=2; expected a rank of the mesh's group \(0..1\) or None"):
        distribute_tensor(Tensor(np.ones((2, 2), np.float32)), mesh["tp"], [Replicate()], src_data_rank=2)
