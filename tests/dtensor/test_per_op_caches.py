"""The dispatcher's per-op caches give the uncached answers (issue 39's per-op cost cut).

What is reused between ops and steps: one TensorLayout instance per (mesh, dims, partial)
(`TensorLayout.from_dims`), each layout's local shapes per global shape, its significant axes,
and a primitive's attributes within one dispatched call (`OpCall.attrs`). A wrong hit would be a
silent wrong result, so each case here changes what the key holds and checks the new answer.
"""
import numpy as np
import pytest
from mindspore import Tensor
import mindspore.ops.operations as P

from mindspore_hyper.runtime.simulation import distribute_tensor
from mindspore_hyper.shard import Layout, TensorLayout
from mindspore_hyper.shard import tensor_layout as tensor_layout_module

MESH = Layout((2, 4), ("data", "tensor"))


def test_from_dims_returns_one_instance_per_key_and_a_new_one_when_the_key_changes():
    a = TensorLayout.from_dims(MESH, [(0,), ()])
    assert TensorLayout.from_dims(MESH, [[0], []]) is a  # lists or tuples: the same key
    other_dims = TensorLayout.from_dims(MESH, [(), (0,)])
    partial = TensorLayout.from_dims(MESH, [(0,), ()], {1: "sum"})
    max_partial = TensorLayout.from_dims(MESH, [(0,), ()], {1: "max"})
    assert len({id(a), id(other_dims), id(partial), id(max_partial)}) == 4
    assert (other_dims.tensor_map, partial.partial, max_partial.partial) == ((None, "data"), {1: "sum"}, {1: "max"})
    assert (a.significant_axes, partial.significant_axes, other_dims.significant_axes) == ((0,), (0, 1), (0,))
    # an equal mesh that is another object keeps its own layouts (a layout's mesh is the one it was made on)
    twin = Layout((2, 4), ("data", "tensor"))
    on_twin = TensorLayout.from_dims(twin, [(0,), ()])
    assert on_twin == a and on_twin is not a and on_twin.mesh is twin


def test_from_dims_still_refuses_bad_dims_and_caches_nothing_for_them():
    with pytest.raises(ValueError, match="used more than once"):
        TensorLayout.from_dims(MESH, [(0,), (0,)])
    with pytest.raises(ValueError, match="already shards"):
        TensorLayout.from_dims(MESH, [(0,), ()], {0: "sum"})
    assert ((0,), (0,)) not in {key[0] for key in MESH.tensor_layouts}


def test_the_layout_memo_starts_over_past_its_bound_and_answers_stay_right(monkeypatch):
    monkeypatch.setattr(tensor_layout_module, "_MEMO_LIMIT", 2)
    monkeypatch.setattr(tensor_layout_module, "_SHAPES_PER_LAYOUT", 2)
    mesh = Layout((2, 4), ("data", "tensor"))
    layouts = [TensorLayout.from_dims(mesh, [()] * ndim) for ndim in range(1, 6)]
    assert len(mesh.tensor_layouts) <= 2
    assert [layout.ndim for layout in layouts] == [1, 2, 3, 4, 5]
    assert TensorLayout.from_dims(mesh, [()] * 5) is layouts[-1]  # the last one is kept
    layout = TensorLayout.from_dims(mesh, [(1,), ()])
    shapes = [(8, 3), (4, 5), (12, 7), (16, 1)]
    assert [layout.local_shape(s) for s in shapes] == [(2, 3), (1, 5), (3, 7), (4, 1)]
    assert len(layout._local_shapes) <= 2


def test_local_shape_memo_keeps_refusing_shapes_the_layout_does_not_divide():
    layout = TensorLayout.from_dims(MESH, [(1,), (0,)])
    assert layout.local_shape((8, 6)) == (2, 3)
    assert layout.local_shape([8, 6]) == (2, 3)  # a list is the same shape
    assert layout.is_even((8, 6)) and not layout.is_even((6, 6))
    with pytest.raises(ValueError, match="dimension 0 of shape \\(6, 6\\) has size 6, not divisible by 4"):
        layout.local_shape((6, 6))
    with pytest.raises(ValueError, match="has 3 dimensions but the tensor map"):
        layout.local_shape((8, 6, 1))
    assert layout.local_shape((8, 6)) == (2, 3)


def test_a_primitive_attribute_changed_between_two_ops_is_read_anew():
    """`OpCall.attrs` is copied once per dispatched call, never per primitive: ReduceSum's
    keep_dims set after the first call makes the second keep the dimension, on every shard
    (its sharding rule reads the attribute to lay the output out), equal to numpy."""
    values = np.arange(48, dtype=np.float32).reshape(8, 6)
    x = distribute_tensor(Tensor(values), MESH("tensor", "data"))
    reduce_sum = P.ReduceSum(keep_dims=False)
    first = reduce_sum(x, 1)
    reduce_sum.add_prim_attr("keep_dims", True)
    second = reduce_sum(x, 1)
    # sums of at most 6 small integers in float32: exact
    np.testing.assert_array_equal(first.full_tensor().asnumpy(), values.sum(axis=1))
    np.testing.assert_array_equal(second.full_tensor().asnumpy(), values.sum(axis=1, keepdims=True))
    assert (first.layout.tensor_map, second.layout.tensor_map) == (("tensor",), ("tensor", None))


def test_redistribution_plans_are_reused_per_shape_and_dtype_and_count_their_own_bytes():
    """The same move of two shapes and two dtypes: each its own plan (its bytes in the report)
    and its own values; moving the first again reuses its plan and counts the same."""
    from mindspore_hyper.dtensor.accounting import Accounting, use_accounting

    src, dst = MESH("data", "tensor"), MESH(None, "tensor")
    cases = [np.arange(32, dtype=np.float32).reshape(8, 4), np.arange(64, dtype=np.float32).reshape(16, 4),
             np.arange(32, dtype=np.float64).reshape(8, 4), np.arange(32, dtype=np.float32).reshape(8, 4)]
    sent = []
    for values in cases:
        accounting = Accounting(8)
        with use_accounting(accounting):
            moved = distribute_tensor(Tensor(values), src).redistribute(dst)
        np.testing.assert_array_equal(moved.full_tensor().asnumpy(), values)  # a gather moves values exactly
        for rank in range(8):
            expected = values[dst.rank_slices(rank, values.shape)]
            np.testing.assert_array_equal(moved.local_shard(rank).asnumpy(), expected)
        (count, send_bytes, input_bytes), = accounting.comm.values()
        sent.append((count, send_bytes, input_bytes))
    # AllGather over data (2 devices): each device sends its shard, (rows / 2) x (4 / 4) items
    assert sent == [(1, 4 * 4, 4 * 4), (1, 8 * 4, 8 * 4), (1, 4 * 8, 4 * 8), (1, 4 * 4, 4 * 4)]


def test_is_float_answers_every_dtype_the_same_when_asked_again():
    import mindspore as ms

    from mindspore_hyper.dtensor.dtensor import is_float

    floats = {ms.float16, ms.float32, ms.float64, ms.bfloat16}
    for dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16, ms.int8, ms.int32, ms.int64, ms.uint8, ms.bool_):
        made = Tensor(np.zeros(2, np.float32)).astype(dtype).dtype  # a tensor's dtype, as the dispatcher reads it
        assert [is_float(dtype), is_float(made), is_float(dtype)] == [dtype in floats] * 3
