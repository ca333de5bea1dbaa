"""Kinds of ops beyond float-in, float-out: random ops, integer and bool outputs, keyword
tensors, tuple outputs and tensor indices, on DTensors of a 2x2 mesh.

Decisions tested here (see docs/simulation.md, "Op coverage"):
- random ops give each device its part of the single device's draw (docs/training.md, "Random
  numbers"; tests/dtensor/test_random.py): distinct shards get different parts, replicas of a
  shard share one; the backward reuses the forward's mask;
- integer and bool results keep the split of their inputs; ops that cannot combine per-shard
  results (argmax, all/any, data-dependent shapes) gather first;
- tensors passed by keyword run replicated (counted as fallbacks), tuple results are tuples of
  DTensors, tensor indices (DTensors or plain) index the global tensor.
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.dtensor import DTensor, distribute_tensor
from mindspore_hyper.dtensor.accounting import Accounting, use_accounting
from mindspore_hyper.shard import Layout

MESH = Layout((2, 2), ("a", "b"))
RNG = np.random.default_rng(8)
ONES = np.ones((8, 64), np.float32)


def shard_values(d: DTensor):
    return [s.asnumpy() for _, s in sorted(d.shards.items())]


# -- random ops -----------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.25, 0.5])
def test_dropout_draws_one_mask_per_distinct_shard(p):
    d = distribute_tensor(Tensor(ONES), MESH("a", None))  # 2 distinct shards, each on 2 devices
    out = ops.dropout(d, p)
    assert out.layout == d.layout
    first, second = shard_values(out)
    scale = 1 / (1 - p)
    for shard in (first, second):
        assert set(np.unique(shard)) <= {0.0, np.float32(scale)}
        assert abs((shard == 0).mean() - p) < 0.15
    assert not np.array_equal(first, second)  # the two shards hold different parts of the one mask


def test_dropout_under_a_global_seed_draws_one_mask_per_distinct_shard():
    ms.set_seed(11)  # fixed kernel seeds: every launch of one primitive would draw the same mask
    d = distribute_tensor(Tensor(ONES), MESH("a", None))
    first, second = shard_values(ops.dropout(d, 0.5))
    assert not np.array_equal(first, second)
    ms.set_seed(11)  # and the draw is reproducible, as a seeded single-device run is
    again = shard_values(ops.dropout(distribute_tensor(Tensor(ONES), MESH("a", None)), 0.5))
    assert np.array_equal(first, again[0]) and np.array_equal(second, again[1])


def test_dropout_replicated_input_draws_one_mask():
    d = distribute_tensor(Tensor(ONES), MESH(None, None))
    out = ops.dropout(d, 0.5)
    assert len(out.shards) == 1  # every device holds the same replica


def test_dropout_backward_reuses_the_forward_mask():
    weights = Tensor(RNG.standard_normal(64).astype(np.float32))

    def loss(x):
        out = ops.dropout(distribute_tensor(x, MESH("a", "b")), 0.5).full_tensor()
        return (out * weights).sum(), out

    (_, out), grad = ms.value_and_grad(loss, has_aux=True)(Tensor(ONES))
    kept = out.asnumpy() != 0
    np.testing.assert_allclose(grad.asnumpy(), kept * 2.0 * weights.asnumpy(), rtol=1e-6)


def test_dropout_off_is_the_identity():
    g = RNG.standard_normal((8, 64)).astype(np.float32)
    drop = nn.Dropout(p=0.5)
    drop.set_train(False)
    np.testing.assert_array_equal(drop(distribute_tensor(Tensor(g), MESH("a", "b"))).asnumpy(), g)
    np.testing.assert_array_equal(ops.dropout(distribute_tensor(Tensor(g), MESH("a", "b")), 0.0).asnumpy(), g)


def test_bernoulli_draws_per_distinct_shard():
    d = distribute_tensor(Tensor(ONES * 0.5), MESH("a", "b"))
    out = ops.bernoulli(d)  # drawn once for the global shape, then split as its input
    assert out.layout == d.layout
    shards = shard_values(out)
    assert all(set(np.unique(s)) <= {0.0, 1.0} for s in shards)
    assert all(not np.array_equal(shards[0], s) for s in shards[1:])


@pytest.mark.parametrize("draw", [ops.rand_like, ops.randn_like])
def test_random_like_ops_read_only_the_shape(draw):
    """MindSpore builds these from the input's shape and dtype alone (no kernel reads it): the
    result is a plain Tensor of the global shape, which ops on DTensors treat as replicated."""
    out = draw(distribute_tensor(Tensor(ONES), MESH("a", "b")))
    assert type(out) is Tensor and out.shape == (8, 64) and out.dtype == ms.float32
    assert len(np.unique(out.asnumpy())) > out.size // 2


# -- integer and bool results ---------------------------------------------------------------------

def test_comparisons_and_integer_arithmetic_keep_the_split():
    g = RNG.integers(-5, 6, (8, 8)).astype(np.int32)
    d = distribute_tensor(Tensor(g), MESH("a", "b"))
    positive = d > 0
    assert positive.dtype == ms.bool_ and positive.layout == d.layout
    np.testing.assert_array_equal(positive.asnumpy(), g > 0)
    count = positive.astype(ms.int32).sum(1)  # Partial(sum) over b, resolved on read
    np.testing.assert_array_equal(count.asnumpy(), (g > 0).sum(1))
    np.testing.assert_array_equal((d // 3 * 2 % 5).asnumpy(), (Tensor(g) // 3 * 2 % 5).asnumpy())


def test_positions_and_bool_reductions_gather_the_reduced_dimension():
    g = RNG.standard_normal((8, 8)).astype(np.float32)
    d = distribute_tensor(Tensor(g), MESH("a", "b"))
    index = ops.argmax(d, 1)
    assert index.dtype == ops.argmax(Tensor(g), 1).dtype and index.layout == MESH("a")
    np.testing.assert_array_equal(index.asnumpy(), g.argmax(1))
    values, positions = ops.max(d, 0)
    np.testing.assert_array_equal(positions.asnumpy(), g.argmax(0))
    np.testing.assert_allclose(values.asnumpy(), g.max(0))
    np.testing.assert_array_equal(ops.any(d > 1.0, 1).asnumpy(), (g > 1.0).any(1))
    np.testing.assert_array_equal(ops.all(d > -3.0).asnumpy(), (g > -3.0).all())


def test_data_dependent_shapes_run_replicated():
    g = RNG.integers(0, 3, (8, 8)).astype(np.int32)
    d = distribute_tensor(Tensor(g), MESH("a", "b"))
    np.testing.assert_array_equal(ops.nonzero(d).asnumpy(), np.stack(np.nonzero(g), 1))
    np.testing.assert_array_equal(ops.unique(d.reshape(-1))[0].asnumpy(), ops.unique(Tensor(g).reshape(-1))[0].asnumpy())


# -- keyword tensors, tuples, tensor indices ------------------------------------------------------

def test_keyword_tensors_run_replicated_and_are_counted():
    g, h, w = (RNG.standard_normal((8, 8)).astype(np.float32) for _ in range(3))
    accounting = Accounting(4)
    with use_accounting(accounting):
        d = distribute_tensor(Tensor(g), MESH("a", "b"))
        out = d.lerp(end=distribute_tensor(Tensor(h), MESH(None, "a")), weight=Tensor(w))
    np.testing.assert_allclose(out.asnumpy(), Tensor(g).lerp(Tensor(h), Tensor(w)).asnumpy(), rtol=1e-6)
    assert accounting.fallbacks["Lerp"] == 1


def test_tuple_results_are_tuples_of_dtensors():
    g = RNG.standard_normal((8, 8)).astype(np.float32)
    d = distribute_tensor(Tensor(g), MESH("a", "b"))
    parts = ops.split(d, 4, 1)
    assert isinstance(parts, tuple) and all(isinstance(p, DTensor) for p in parts)
    for got, want in zip(parts, np.split(g, 2, 1)):
        np.testing.assert_array_equal(got.asnumpy(), want)
    values, indices = ops.topk(d, 3)
    assert values.layout == indices.layout == MESH("a", None)
    np.testing.assert_array_equal(indices.asnumpy(), np.argsort(-g, 1)[:, :3])


def test_lstm_runs_on_its_batch_split_and_hides_the_workspace():
    from mindspore.ops import operations as P

    lstm = P.LSTM(input_size=4, hidden_size=6, num_layers=1, has_bias=True, bidirectional=False, dropout=0.0)
    x = Tensor(RNG.standard_normal((5, 4, 4)).astype(np.float32))  # (sequence, batch, features)
    h, c = (Tensor(RNG.standard_normal((1, 4, 6)).astype(np.float32)) for _ in range(2))
    w = Tensor(RNG.standard_normal((4 * 6 * (4 + 6 + 2), 1, 1)).astype(np.float32) * 0.3)
    expected = lstm(x, h, c, w)
    got = lstm(distribute_tensor(x, MESH(None, "a", None)), h, c, w)
    for e, g in zip(expected[:3], got[:3]):
        assert g.layout.tensor_map == (None, "a", None)
        np.testing.assert_allclose(g.asnumpy(), e.asnumpy(), rtol=1e-5, atol=1e-6)
    assert got[3] is None and got[4] is None  # per-device workspaces have no global value


@pytest.mark.parametrize("index_layout", [("a",), (None,)])
def test_tensor_indices(index_layout):
    g = RNG.standard_normal((8, 8)).astype(np.float32)
    idx = RNG.integers(0, 8, (4,)).astype(np.int32)
    d = distribute_tensor(Tensor(g), MESH("a", "b"))
    di = distribute_tensor(Tensor(idx), MESH(*index_layout))
    np.testing.assert_array_equal(ops.gather(d, di, 0).asnumpy(), g[idx])
    np.testing.assert_array_equal(ops.gather(d, di, 1).asnumpy(), g[:, idx])
    np.testing.assert_array_equal(ops.index_select(d, 1, di).asnumpy(), g[:, idx])
    np.testing.assert_array_equal(d[di].asnumpy(), g[idx])
    np.testing.assert_array_equal(ops.masked_select(d, d > 0).asnumpy(), g[g > 0])
