"""Each sharding-rule family on DTensors with varied input layouts equals the plain op
(forward and gradient), and no op silently falls back."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.shard import Layout
from mindspore_hyper.runtime.simulation import distribute_tensor
from mindspore_hyper.dtensor.accounting import Accounting, use_accounting

MESH = Layout((2, 2, 2), ("a", "b", "c"))
RNG = np.random.default_rng(11)
LAYOUTS_3D = [(None, None, None), ("a", None, None), (None, "b", "c"), (("a", "b"), None, "c"),
              ("c", "a", "b"), (None, None, ("a", "b", "c"))]


def x3(shape=(8, 8, 8)):
    return Tensor(RNG.standard_normal(shape).astype(np.float32))


def check(fn, inputs, layouts, allow_fallback=False, grad=True):
    """fn on DTensors (laid out by `layouts`) == fn on plain tensors, forward and d(sum)/d(inputs)."""
    acc = Accounting(8)

    def sim(*xs):
        with use_accounting(acc):
            dts = [distribute_tensor(x, MESH(*l)) if l is not None else x for x, l in zip(xs, layouts)]
            out = fn(*dts)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            return [o.full_tensor() for o in outs]

    ref = fn(*inputs)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    got = sim(*inputs)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g.asnumpy(), r.asnumpy(), rtol=1e-5, atol=1e-5)
    if not allow_fallback:
        assert not acc.fallbacks, f"unexpected replication fallbacks: {dict(acc.fallbacks)}"
    if grad:
        positions = tuple(i for i, x in enumerate(inputs) if x.dtype == ms.float32)
        gr = ms.grad(lambda *xs: sum(o.sum() for o in (lambda r: r if isinstance(r, (tuple, list)) else (r,))(fn(*xs))), positions)(*inputs)
        gs = ms.grad(lambda *xs: sum(o.sum() for o in sim(*xs)), positions)(*inputs)
        gr, gs = (gr, gs) if isinstance(gr, tuple) else ((gr,), (gs,))
        for a, b in zip(gr, gs):
            np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-5, atol=1e-5)
    return acc


@pytest.mark.parametrize("layout", LAYOUTS_3D)
@pytest.mark.parametrize("name,fn", [
    ("relu", ops.relu), ("gelu", lambda x: ops.gelu(x, approximate="tanh")), ("silu", ops.silu),
    ("tanh", ops.tanh), ("sigmoid", ops.sigmoid), ("cast", lambda x: ops.cast(x, ms.float16).astype(ms.float32)),
    ("scale", lambda x: x * 3.0 - 1.0), ("square", lambda x: x * x / 2.0),
])
def test_unary_elementwise(name, fn, layout):
    check(fn, [x3()], [layout])


@pytest.mark.parametrize("la,lb", [(("a", None, None), (None, "b", "c")), ((None, None, "c"), ("c", None, None)),
                                   (("a", "b"), ("c",))])
def test_binary_broadcasting(la, lb):
    a = x3()
    b = x3((8, 8, 8)) if len(lb) == 3 else Tensor(RNG.standard_normal((8, 8)).astype(np.float32))
    if len(la) == 2:
        a = Tensor(RNG.standard_normal((8, 8)).astype(np.float32))
        b = Tensor(RNG.standard_normal((8,)).astype(np.float32))
    check(lambda x, y: ops.maximum(x + y, x * y), [a, b], [la, lb])


@pytest.mark.parametrize("la,lb", [
    ((None, "a"), ("a", None)),          # contraction sharded -> Partial
    (("b", None), (None, "c")),           # row x column
    (("a", "b"), ("b", "c")),             # both
    (("c", None), ("c", None)),           # conflicting use of an axis
])
def test_matmul_partial_resolution(la, lb):
    a, b = Tensor(RNG.standard_normal((8, 16)).astype(np.float32)), Tensor(RNG.standard_normal((16, 8)).astype(np.float32))
    check(lambda x, y: ops.relu(ops.matmul(x, y)), [a, b], [la, lb])


def test_partial_propagates_through_linear_ops_without_communication():
    a, b = Tensor(RNG.standard_normal((8, 16)).astype(np.float32)), Tensor(RNG.standard_normal((16, 8)).astype(np.float32))
    bias = Tensor(RNG.standard_normal((8,)).astype(np.float32))
    acc = check(lambda x, y, z: (1.0 - (ops.matmul(x, y) * 2.0 + z) - 1).sum(0), [a, b, bias],
                [(None, "a"), ("a", None), (None,)])
    # only the final full_tensor reduces the Partial: one AllReduce on 'a' of the (8,) float32
    # result (32 B in, 2*(2-1)/2*32 B sent) per run; check() runs forward twice (value and grad)
    assert dict(acc.comm) == {("AllReduce", "a"): [2, 64, 64]}


@pytest.mark.parametrize("layout", [("a", None, "b"), (None, "c", ("a", "b"))])
def test_batch_matmul(layout):
    a, b = x3((8, 8, 4)), x3((8, 4, 8))
    check(lambda x, y: ops.matmul(x, y), [a, b], [layout[:2] + (None,), (layout[0], None, layout[2])])


@pytest.mark.parametrize("layout", LAYOUTS_3D)
@pytest.mark.parametrize("name,fn", [
    ("sum_all", lambda x: x.sum()), ("sum_dim", lambda x: x.sum(1)), ("mean_keep", lambda x: x.mean(-1, keep_dims=True)),
    ("max_dim", lambda x: x.max(0)), ("mean_two", lambda x: x.mean((0, 2))), ("min", lambda x: ops.amin(x, 2)),
])
def test_reductions(name, fn, layout):
    check(fn, [x3()], [layout], grad=name not in ("max_dim", "min"))


@pytest.mark.parametrize("layout", LAYOUTS_3D)
def test_softmax_logsoftmax(layout):
    check(lambda x: ops.softmax(x, -1) + ops.log_softmax(x, 1), [x3()], [layout])


@pytest.mark.parametrize("layout", [("a", None, None), ("a", "b", "c"), (None, None, "c")])
def test_layernorm_cell(layout):
    ln = nn.LayerNorm((8,))
    ln.gamma.set_data(Tensor(RNG.standard_normal(8).astype(np.float32)))
    check(ln, [x3()], [layout])


@pytest.mark.parametrize("layout,shape", [
    (("a", "b", "c"), (64, 8)), ((("a", "b"), None, "c"), (4, 2, 8, 8)), ((None, "c", None), (8, 64)),
    (("a", None, None), (2, 4, 64)), ((None, None, ("a", "b")), (512,)),
])
def test_reshape(layout, shape):
    check(lambda x: ops.reshape(x, shape) * 2.0, [x3()], [layout])


@pytest.mark.parametrize("layout", LAYOUTS_3D)
def test_transpose_expand_squeeze(layout):
    check(lambda x: ops.squeeze(ops.expand_dims(x.transpose(2, 0, 1), 1), 1).swapaxes(0, 2), [x3()], [layout])


@pytest.mark.parametrize("layout", LAYOUTS_3D)
def test_concat_split_slice(layout):
    def fn(x):
        y = ops.concat([x, x * 2.0], 1)
        p, q = ops.split(y, 8, 1)
        return p[:, 2:6].mean(1, keep_dims=True) + q[1:7:2].sum() + ops.stack([p, q], 0).mean(0)[..., 0:1]

    check(fn, [x3()], [layout])


@pytest.mark.parametrize("vocab_layout", [("a", None), (("a", "b"), "c"), (None, "c")])
def test_embedding_gather_vocab_parallel(vocab_layout):
    table = Tensor(RNG.standard_normal((16, 8)).astype(np.float32))
    ids = Tensor(RNG.integers(0, 16, (4, 6)).astype(np.int32))
    check(lambda t, i: ops.gather(t, i, 0) * 1.5, [table, ids], [vocab_layout, ("c" if vocab_layout[0] != ("a", "b") and vocab_layout[1] != "c" else None, None)])


def test_embedding_vocab_parallel_per_shard_lookup_is_exact():
    """A table too large to batch takes the per-shard lookup (cached id -> local row map, zero
    row for ids another shard holds): rows and table gradient bit-equal one device, ids on
    every shard boundary included; the map sends each shard's ids to their local rows."""
    from mindspore_hyper.dtensor.batched import BATCH_BELOW_ELEMENTS
    from mindspore_hyper.dtensor.rules.embedding import local_rows

    vocab, width = 512, 256
    assert vocab // 4 * width >= BATCH_BELOW_ELEMENTS  # each shard runs on its own
    table = Tensor(RNG.standard_normal((vocab, width)).astype(np.float32))
    ids = np.concatenate([[0, 127, 128, 255, 256, 383, 384, 511, 5, 5], RNG.integers(0, vocab, 14)])
    ids = Tensor(ids.reshape(4, 6).astype(np.int32))
    weight = Tensor(RNG.standard_normal((4, 6, width)).astype(np.float32))

    def fn(t, i):
        return ops.gather(t, i, 0) * weight

    def sim(t, i):
        return fn(distribute_tensor(t, MESH(("a", "b"), None)), distribute_tensor(i, MESH("c", None))).full_tensor()

    np.testing.assert_array_equal(sim(table, ids).asnumpy(), fn(table, ids).asnumpy())
    grad_ref = ms.grad(lambda t: fn(t, ids).sum())(table)
    grad_sim = ms.grad(lambda t: sim(t, ids).sum())(table)
    np.testing.assert_array_equal(grad_sim.asnumpy(), grad_ref.asnumpy())
    rows = local_rows(vocab, 1, 128, ms.int32).asnumpy()
    np.testing.assert_array_equal(rows[128:256], np.arange(128))
    assert (rows[:128] == 128).all() and (rows[256:] == 128).all()



def test_embedding_vocab_parallel_out_of_range_id_raises_as_on_one_device():
    """An id past the vocabulary is an error on one device; the per-shard lookup raises too
    rather than reading a zero (or another shard's) row."""
    vocab, width = 512, 256
    table = Tensor(RNG.standard_normal((vocab, width)).astype(np.float32))
    ids = Tensor(np.array([[3, vocab + 7], [1, 2]], np.int32))
    with pytest.raises(RuntimeError, match="Gather"):
        ops.gather(table, ids, 0).asnumpy()
    with pytest.raises(RuntimeError, match="Gather"):
        ops.gather(distribute_tensor(table, MESH(("a", "b"), None)),
                   distribute_tensor(ids, MESH("c", None)), 0).full_tensor().asnumpy()

def test_cross_entropy_pieces_on_vocab_sharded_logits():
    logits = Tensor(RNG.standard_normal((8, 16)).astype(np.float32))
    labels = Tensor(RNG.integers(0, 16, (8,)).astype(np.int32))
    check(lambda x, y: nn.CrossEntropyLoss()(x, y), [logits, labels], [("a", ("b", "c")), ("a",)])


def test_softmax_cross_entropy_primitive():
    logits = Tensor(RNG.standard_normal((8, 16)).astype(np.float32))
    labels = Tensor(RNG.integers(0, 16, (8,)).astype(np.int32))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    check(loss, [logits, labels], [("a", "b"), ("a",)])


def test_gather_d_and_masked_fill():
    x = x3((8, 8, 8))
    index = Tensor(RNG.integers(0, 8, (8, 8, 8)).astype(np.int64))
    mask = Tensor(RNG.random((8, 8, 8)) > 0.5)
    check(lambda a, i, m: ops.masked_fill(ops.gather_elements(a, 2, i), m, 0.0), [x, index, mask],
          [("a", None, "c"), ("a", "b", None), (None, "b", None)])


def test_dropout_in_eval_and_train_keeps_layout():
    drop = nn.Dropout(p=0.5)
    drop.set_train(False)
    check(drop, [x3()], [("a", "b", None)])
    drop.set_train(True)
    dt = distribute_tensor(x3(), MESH("a", "b", None))
    out = drop(dt)
    assert out.layout == dt.layout  # per-device masks, like real devices


def test_unknown_op_falls_back_correctly():
    acc = check(lambda x: ops.diagonal(x), [x3()], [("a", "b", None)], allow_fallback=True)  # no rule
    assert sum(acc.fallbacks.values()) == 2  # once per run: check() runs forward for value and grad


def test_list_operands_of_old_style_primitives_are_intercepted():
    # Stack and AddN take their tensors in a list; MindSpore does not call __fallback__ for them,
    # the interception guard routes them to the dispatcher (else they would compute on placeholders)
    check(lambda x, y: ops.stack([x, y], 1).sum(1) + ops.addn([x, y, x]), [x3(), x3()],
          [("a", None, "c"), (None, "b", "c")])


def test_tensors_passed_by_keyword_are_laid_out_too():
    from mindspore import mint

    low = Tensor(np.full((8, 8, 8), 0.1, np.float32))
    acc = check(lambda x, lo: mint.clamp(x, min=lo), [x3(), low], [("a", None, "c"), (None, "b", None)],
                allow_fallback=True)
    assert sum(acc.fallbacks.values()) == 2  # keyword tensors take the replicated path, counted


def x4(shape=(8, 4, 6, 6)):
    return Tensor(RNG.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("x_layout,w_layout", [
    (("a", None, None, None), (None, None, None, None)),      # batch split
    (("a", "b", None, None), ("c", "b", None, None)),         # + contraction -> Partial, + output channels
    ((None, None, "c", None), ("a", None, None, None)),       # a split image row is gathered
])
def test_conv2d(x_layout, w_layout):
    weight = x4((6, 4, 3, 3))
    check(lambda x, w: ops.relu(ops.conv2d(x, w, pad_mode="pad", padding=1)), [x4(), weight], [x_layout, w_layout])


def test_grouped_conv2d_keeps_only_the_batch_split():
    weight = x4((4, 2, 3, 3))
    check(lambda x, w: ops.conv2d(x, w, groups=2), [x4(), weight], [("a", "b", None, None), ("c", None, None, None)])


@pytest.mark.parametrize("layout", [("a", "b", None, None), (None, ("a", "c"), "b", None)])
def test_pooling(layout):
    check(lambda x: ops.max_pool2d(x, 2) + ops.avg_pool2d(x, 2, 2) + ops.adaptive_avg_pool2d(x, 3), [x4()], [layout])


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("layout", [("a", "b", None, None), (None, None, "c", ("a", "b"))])
def test_batch_norm(training, layout):
    mean, var = Tensor(np.zeros(4, np.float32)), Tensor(np.ones(4, np.float32) * 2)
    check(lambda x, w, b: ops.batch_norm(x, mean, var, w, b, training=training), [x4((8, 4, 6, 8)), x3((4,)), x3((4,))],
          [layout, ("b",), (None,)])


@pytest.mark.parametrize("layouts", [
    [("a", "b"), ("c", "b"), ("c",)], [(None, ("a", "b")), (None, ("a", "b")), (None,)], [("a", None), ("a", None), ("a",)],
])
def test_dense(layouts):
    x, w, b = x3((8, 16)), x3((8, 16)), x3((8,))
    check(lambda x_, w_, b_: ops.dense(x_, w_, b_), [x, w, b], layouts)


@pytest.mark.parametrize("name,fn,layout", [
    ("cumsum", lambda x: ops.cumsum(x, 1), ("a", "b", "c")),
    ("cumprod", lambda x: ops.cumprod(x * 0.1 + 1.0, 0), (None, ("a", "b"), None)),
    ("sort", lambda x: ops.sort(x, 1)[0], ("a", "b", "c")), ("topk", lambda x: ops.topk(x, 3)[0], (None, "a", "c")),
    ("flip", lambda x: ops.flip(x, (1,)), (None, ("a", "b"), None)), ("tril", lambda x: ops.tril(x), ("a", "b", "c")),
    ("l2_normalize", lambda x: ops.L2Normalize(axis=1)(x), ("c", "a", None)),
    ("prod", lambda x: ops.prod(x * 0.1 + 1.0, 1), ("a", "b", "c")), ("std", lambda x: ops.std(x, 2), (None, "b", "a")),
    ("unbind", lambda x: ops.unbind(x, 1), ("a", "b", None)),
])
def test_ops_along_whole_dims(name, fn, layout):
    check(fn, [x3()], [layout])


@pytest.mark.parametrize("name,fn,layout", [
    ("tile", lambda x: ops.tile(x, (1, 2, 1)), ("a", "b", "c")), ("pad", lambda x: ops.pad(x, (1, 2)), ("a", "b", "c")),
    ("flatten", lambda x: ops.flatten(x), (("a", "b"), None, "c")),
    ("flatten_ext", lambda x: mindspore_flatten(x), ("a", "b", "c")),
    ("expand_as", lambda x: x[:, :1].expand_as(x), (("a", "b"), None, "c")),
])
def test_shape_ops(name, fn, layout):
    check(fn, [x3()], [layout])


def mindspore_flatten(x):
    from mindspore import mint

    return mint.flatten(x, 0, 1)


def test_one_hot_keeps_the_index_split():
    ids = Tensor(RNG.integers(0, 5, (8, 4)).astype(np.int32))
    check(lambda i: ops.one_hot(i, 5), [ids], [("a", "b")], grad=False)


@pytest.mark.parametrize("layouts", [[("a", "b", "c"), ("b",)], [(None, None, ("a", "b")), ("a",)]])
def test_gather_along_a_later_axis(layouts):
    ids = Tensor(RNG.integers(0, 8, (4,)).astype(np.int32))
    check(lambda x, i: ops.gather(x, i, 1) * 2.0, [x3(), ids], layouts)


def test_prelu_slopes_follow_the_channel_split():
    check(lambda x, w: ops.prelu(x, w), [x3(), x3((8,))], [("a", "b", "c"), (None,)])


@pytest.mark.parametrize("layouts,split", [
    ([("a", None, ("b", "c")), ("a", None, None)], ("b", "c")),  # the gathered dimension split over two axes
    ([(None, "b", "c"), ("a", "b", None)], ("c",)),              # the index's own split on "a" moves
    ([(("a", "b"), None, "c"), (None, None, None)], ("c",)),
])
def test_gather_d_along_a_split_dimension_picks_locally(layouts, split):
    """Along a split gathered dimension each device picks what it holds (Partial sum over the
    split's axes): the input is not gathered over them; the values and gradients of the plain
    op; negative indices wrap."""
    x = x3((8, 4, 8))
    index = Tensor(RNG.integers(-8, 8, (8, 4, 3)).astype(np.int32))
    check(lambda a, i: ops.gather_elements(a, 2, i) * 2.0, [x, index], layouts)
    acc = Accounting(8)
    dx, di = distribute_tensor(x, MESH(*layouts[0])), distribute_tensor(index, MESH(*layouts[1]))
    with use_accounting(acc):
        out = ops.gather_elements(dx, 2, di)
    assert not [axis for kind, axis in acc.comm if kind == "AllGather" and axis in split], dict(acc.comm)
    assert out.layout.partial == {"abc".index(a): "sum" for a in split}


def test_gather_d_along_a_split_dimension_keeps_infinities_and_refuses_bad_indices():
    x = x3((4, 8))
    x[0, 5] = -np.inf  # a log-probability of zero elsewhere on the row must not turn into NaN
    index = Tensor(np.array([[1], [6], [0], [7]], np.int32))
    got = ops.gather_elements(distribute_tensor(x, MESH(None, ("a", "b"))), 1, index).full_tensor()
    np.testing.assert_array_equal(got.asnumpy(), ops.gather_elements(x, 1, index).asnumpy())
    with pytest.raises(IndexError, match=r"GatherD: index values must be in \[-8, 8\).*\[0, 8\]"):
        ops.gather_elements(distribute_tensor(x, MESH(None, "a")), 1, Tensor(np.array([[8], [0], [1], [2]], np.int32)))


def test_gather_d_with_an_index_shorter_than_the_input():
    """GatherD accepts an index smaller than the input on the other dimensions: its rows are the
    input's first rows, not its own shard's, so such a dimension is not split."""
    x = x3((8, 8))
    index = Tensor(RNG.integers(0, 8, (4, 2)).astype(np.int32))
    check(lambda a, i: ops.gather_elements(a, 1, i), [x, index], [("a", None), ("a", None)])
    check(lambda a, i: ops.gather_elements(a, 1, i), [x, index], [("a", "b"), ("a", None)])


def test_gather_d_along_a_split_dimension_with_an_empty_index():
    """Nothing to pick: the input is laid out whole on the dimension, as the single-device op runs it."""
    x = x3((4, 8))
    index = Tensor(np.zeros((4, 0), np.int32))
    got = ops.gather_elements(distribute_tensor(x, MESH(None, ("a", "b"))), 1, index).full_tensor()
    assert got.shape == (4, 0)
