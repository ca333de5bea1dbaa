"""Uneven Shard(d): dimensions the devices do not divide, split as torch.chunk splits them
(ceil(n / k) rows per device, the trailing devices fewer or none), through the DTensor API, ops,
fully_shard and hsdp, against numpy and a single-device model."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.dtensor.dispatch import DTensorOpError
from mindspore_hyper.hyper_parallel import (
    DTensor, Partial, Replicate, Shard, distribute_tensor, hsdp, init_device_mesh, laid_out_parameters, ones, zeros,
)
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard
from mindspore_hyper.hyper_parallel.report import session_report

# torch.chunk row counts of 7 rows and 3 rows over 4 devices (what torch's DTensor gives)
SEVEN_OVER_FOUR, THREE_OVER_FOUR = [2, 2, 2, 1], [1, 1, 1, 0]


@pytest.fixture
def mesh(fresh_session):
    fresh_session.set_context(device_num=4)
    return init_device_mesh("npu", (4,), mesh_dim_names=("dp",))


def values(rows=7, cols=3):
    return np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) / 7.0


def piece_rows(d, dim=0):
    local = d.to_local()
    return [local.local_shard(r).shape[dim] for r in range(4)]


def test_distribute_gives_torch_chunk_pieces_and_gathers_back(mesh):
    x = values()
    d = distribute_tensor(Tensor(x), mesh, [Shard(0)])
    assert d.shape == (7, 3) and d.placements == (Shard(0),) and piece_rows(d) == SEVEN_OVER_FOUR
    local = d.to_local()
    starts = np.cumsum([0] + SEVEN_OVER_FOUR)
    for r in range(4):
        np.testing.assert_array_equal(local.local_shard(r).asnumpy(), x[starts[r]:starts[r + 1]])
    np.testing.assert_array_equal(d.full_tensor().asnumpy(), x)
    np.testing.assert_array_equal(d.redistribute(mesh, [Replicate()]).to_local().asnumpy(), x)


def test_factories_with_fewer_rows_than_devices(mesh):
    for make, fill in ((ones, 1.0), (zeros, 0.0)):
        d = make(3, 5, device_mesh=mesh, placements=[Shard(0)])
        assert d.shape == (3, 5) and piece_rows(d) == THREE_OVER_FOUR
        np.testing.assert_array_equal(d.full_tensor().asnumpy(), np.full((3, 5), fill, np.float32))


def test_from_local_with_shape_takes_each_ranks_piece_and_checks_it(mesh):
    x = values()
    local = distribute_tensor(Tensor(x), mesh, [Shard(0)]).to_local()
    back = DTensor.from_local(local, mesh, [Shard(0)], shape=(7, 3), run_check=True)
    np.testing.assert_array_equal(back.full_tensor().asnumpy(), x)
    with pytest.raises(ValueError, match=r"rank 3 has \(1, 3\), expected \(2, 3\)"):
        DTensor.from_local(local, mesh, [Shard(0)], shape=(8, 3))
    with pytest.raises(ValueError, match=r"rank 3 has \(2, 3\), expected \(1, 3\)"):  # one value on every rank
        DTensor.from_local(Tensor(x[:2]), mesh, [Shard(0)], shape=(7, 3))


@pytest.mark.parametrize("source, target", [
    ([Shard(0)], [Shard(1)]), ([Shard(1)], [Shard(0)]), ([Shard(0)], [Replicate()]), ([Replicate()], [Shard(1)]),
], ids=["S0-S1", "S1-S0", "S0-R", "R-S1"])
def test_redistribute_between_uneven_layouts(mesh, source, target):
    x = values(7, 3)  # 7 rows and 3 columns: both uneven over 4 devices
    d = distribute_tensor(Tensor(x), mesh, source).redistribute(mesh, target)
    assert d.placements == tuple(target)
    np.testing.assert_array_equal(d.full_tensor().asnumpy(), x)
    if target[0].is_shard():
        dim = target[0].dim
        assert piece_rows(d, dim) == (SEVEN_OVER_FOUR if dim == 0 else THREE_OVER_FOUR)


@pytest.mark.parametrize("target", [[Shard(0)], [Replicate()]], ids=["P-S0", "P-R"])
def test_partial_to_uneven_shard_or_replicate(mesh, target):
    x = values()
    d = DTensor.from_local(Tensor(x), mesh, [Partial("sum")]).redistribute(mesh, target)
    # four ranks each passing x: the sum is 4 x (exact in float32: x has 3 significant bits per 1/7 step)
    np.testing.assert_allclose(d.full_tensor().asnumpy(), 4 * x, rtol=1e-6)
    if target[0].is_shard():
        assert piece_rows(d) == SEVEN_OVER_FOUR


def test_nested_uneven_split_on_a_2d_mesh(fresh_session):
    """A dimension split over two mesh axes is chunked axis by axis (torch's order): 5 rows over
    dp=2 -> 3, 2; each over tp=2 -> 2, 1 and 1, 1."""
    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    x = values(5, 6)
    d = distribute_tensor(Tensor(x), mesh, [Shard(0), Shard(0)])
    assert piece_rows(d) == [2, 1, 1, 1]
    np.testing.assert_array_equal(d.full_tensor().asnumpy(), x)
    moved = d.redistribute(mesh, [Shard(1), Shard(0)])
    np.testing.assert_array_equal(moved.full_tensor().asnumpy(), x)


def test_ops_and_gradients_on_uneven_rows(mesh):
    x, w = values(), np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5)

    def loss(t):
        d = distribute_tensor(t, mesh, [Shard(0)])
        h = ops.matmul(ops.tanh(d * 2.0 + 1.0), Tensor(w))  # elementwise, then matmul over uneven rows
        assert h.placements == (Shard(0),) and h.shape == (7, 5)
        return ops.softmax(h, -1).sum(0).sum()  # softmax along the whole dim; sum over the split one

    value, grad = ms.value_and_grad(loss)(Tensor(x))
    h = np.tanh(2 * x + 1) @ w
    e = np.exp(h - h.max(-1, keepdims=True))
    np.testing.assert_allclose(float(value), (e / e.sum(-1, keepdims=True)).sum(), rtol=1e-6)
    # softmax rows sum to 1 whatever x is: the gradient is 0 up to float32 rounding of O(1) terms
    np.testing.assert_allclose(grad.asnumpy(), np.zeros_like(x), atol=1e-5)

    def squares(t):
        d = distribute_tensor(t, mesh, [Shard(0)])
        return (d * d).sum(0).full_tensor().sum()

    np.testing.assert_allclose(ms.grad(squares)(Tensor(x)).asnumpy(), 2 * x, rtol=1e-6)


def test_ops_that_cannot_run_on_uneven_pieces_are_refused_by_name(mesh):
    d = distribute_tensor(Tensor(values()), mesh, [Shard(0)])
    with pytest.raises(DTensorOpError, match=r"MeanExt: input 0 of shape \(7, 3\) has dimension 0 split into uneven"):
        d.mean(0)
    with pytest.raises(DTensorOpError, match=r"Concat: input 0 .* dimension 0 split into uneven pieces over 4"):
        ops.concat([d, d], 1)  # Concat's rule would keep dimension 0 split: it needs equal shards
    # what gathers the split dimension first (Reshape, Concat along it) runs, with the right values
    np.testing.assert_array_equal(d.reshape(21).asnumpy(), values().reshape(21))
    np.testing.assert_array_equal(ops.concat([d, d], 0).asnumpy(), np.concatenate([values(), values()]))
    # a per-dimension op along the whole dimension keeps the uneven split
    cumsum = ops.cumsum(d, 1)
    assert cumsum.placements == (Shard(0),)
    np.testing.assert_allclose(cumsum.asnumpy(), np.cumsum(values(), 1), rtol=1e-6)
    expanded = ops.transpose(d.expand_dims(0), (1, 0, 2))  # (7, 1, 3): the split follows the rows
    assert expanded.placements == (Shard(0),) and expanded.shape == (7, 1, 3)
    np.testing.assert_array_equal(expanded.asnumpy(), values()[:, None, :])


def test_indexing_and_in_place_ops_on_uneven_rows(mesh):
    x = values()
    d = distribute_tensor(Tensor(x), mesh, [Shard(0)])
    np.testing.assert_array_equal(d[1:6].asnumpy(), x[1:6])  # indexed on the gathered value
    np.testing.assert_array_equal(d[:, 1].asnumpy(), x[:, 1])
    d += 1.0  # in place, by the elementwise rule: stays split
    assert d.placements == (Shard(0),) and piece_rows(d) == SEVEN_OVER_FOUR
    d[2] = 0.0  # gathered, assigned, laid out again
    expected = x + 1.0
    expected[2] = 0.0
    np.testing.assert_array_equal(d.asnumpy(), expected)
    assert piece_rows(d) == SEVEN_OVER_FOUR


class Small(nn.Cell):
    """7 and 3 output rows: neither divides by 4 devices."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Dense(5, 7), nn.Dense(7, 3)

    def construct(self, x):
        return self.down(ops.tanh(self.up(x)))


def _train(model, steps=3):
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    x = Tensor(np.random.RandomState(0).randn(4, 5).astype(np.float32))
    y = Tensor(np.random.RandomState(1).randn(4, 3).astype(np.float32))
    grad_fn = ms.value_and_grad(lambda x, y: ((model(x) - y) ** 2).mean(), None, optimizer.parameters)
    losses = []
    for _ in range(steps):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        losses.append(float(loss.full_tensor() if isinstance(loss, DTensor) else loss))
    return losses


def _twins():
    ms.set_seed(0)
    model, reference = Small(), Small()
    for (_, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        q.set_data(Tensor(p.asnumpy()))
    return model, reference


def test_fully_shard_splits_rows_the_mesh_does_not_divide_and_trains_like_one_device(mesh):
    model, reference = _twins()
    fully_shard(model, mesh=mesh)
    pieces = {k: piece_rows(v) for k, v in laid_out_parameters(model).items()}
    assert pieces == {"up.weight": SEVEN_OVER_FOUR, "up.bias": SEVEN_OVER_FOUR,
                      "down.weight": THREE_OVER_FOUR, "down.bias": THREE_OVER_FOUR}
    # Adam moves each weight by ~lr = 1e-2 per step; float32 sums of <= 7 terms differ by ~1e-7
    # relative between the split and whole runs, so 1e-5 separates rounding from a wrong gradient
    np.testing.assert_allclose(_train(model), _train(reference), rtol=1e-5)
    for (name, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), atol=1e-5, err_msg=name)
    # the report counts each device's real pieces: rank 0 holds 2 + 2 rows of up, 1 + 1 of down
    expected = (2 * 5 + 2 + 1 * 7 + 1) * 4
    assert session_report("simulation", 4)["meshes"][0]["parameter_bytes_per_device"] == expected


class Pair(nn.Cell):
    """A 2-row and a 3-row weight."""

    def __init__(self):
        super().__init__()
        self.two, self.three = nn.Dense(4, 2), nn.Dense(2, 3)

    def construct(self, x):
        return self.three(ops.tanh(self.two(x))).sum()


def test_hsdp_splits_rows_over_the_largest_group_that_divides_them(fresh_session):
    """Upstream's rule: the effective shard size is gcd(rows, group) (capped by shard_size), so
    hsdp never makes uneven pieces: over a 2 x 2 data-parallel group a 2-row weight is split over
    the inner 2 devices, a 3-row one stays whole; gradients are the group's sum."""
    fresh_session.set_context(device_num=4)
    init_device_mesh("npu", (2, 2), mesh_dim_names=("a", "b"))
    ms.set_seed(0)
    model, reference = Pair(), Pair()
    for (_, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        q.set_data(Tensor(p.asnumpy()))
    hsdp(model, threshold=0)
    sizes = {name: p.hsdp_effective_shard_size for name, p in model.parameters_and_names()}
    assert sizes == {"two.weight": 2, "two.bias": 2, "three.weight": 1, "three.bias": 1}
    placements = {k: v.placements for k, v in laid_out_parameters(model).items()}
    assert placements["two.weight"] == (Replicate(), Shard(0)) and placements["three.weight"] == (Replicate(),) * 2
    x = Tensor(np.random.RandomState(2).randn(5, 4).astype(np.float32))
    _, grads = ms.value_and_grad(model, None, model.trainable_params())(x)
    _, expected = ms.value_and_grad(reference, None, reference.trainable_params())(x)
    for g, r in zip(grads, expected):  # plain inputs: the 4 ranks' equal gradients summed (test_hsdp)
        np.testing.assert_allclose(g.asnumpy(), 4 * r.asnumpy(), rtol=1e-5, atol=1e-6)
