"""Redistribution planner: minimal plans for basic transitions and exhaustive correctness
against the numpy reference executor on a (2,2,2) mesh."""
import itertools

import numpy as np
import pytest

from mindspore_hyper.shard import (
    AllGather, AllReduce, AllToAll, Layout, LocalSlice, MakePartial, ReduceScatter, TensorLayout,
    plan_redistribution,
)
from mindspore_hyper.shard.reference_executor import apply_plan, gather, scatter

MESH = Layout((2, 2, 2), ("a", "b", "c"))
SHAPE = (8, 8, 8)


def all_layouts(ops=("sum",)):
    """Every layout of a 3-D tensor on MESH: each axis shards a dim, replicates, or is Partial;
    every order of axes within a dimension."""
    choices = [0, 1, 2, "R"] + [("P", op) for op in ops]
    out = []
    for assign in itertools.product(choices, repeat=3):
        dims, partial = [[] for _ in range(3)], {}
        for axis, choice in enumerate(assign):
            if isinstance(choice, tuple):
                partial[axis] = choice[1]
            elif choice != "R":
                dims[choice].append(axis)
        if len(set(partial.values())) > 1:
            continue  # one tensor's Partial axes share one op (TensorLayout rejects mixtures)
        for orders in itertools.product(*[itertools.permutations(d) for d in dims]):
            out.append(TensorLayout.from_dims(MESH, orders, partial))
    return out


def assert_equal(actual, expected, message):
    """np.testing.assert_array_equal's report, paid only on a mismatch (the exhaustive test makes 30k checks)."""
    if not np.array_equal(actual, expected):
        np.testing.assert_array_equal(actual, expected, err_msg=message)


def run(src, dst, global_array, src_shards=None):
    plan = plan_redistribution(src, dst, global_array.shape, "float32")
    shards = apply_plan(src_shards if src_shards is not None else scatter(global_array, src), plan)
    for rank in MESH.ranks:
        expected_shape = dst.local_shape(global_array.shape)
        assert shards[rank].shape == expected_shape, (src, dst, plan)
    return plan, shards


def test_exhaustive_pairs_with_sum_partials():
    layouts = all_layouts()
    assert len(layouts) == 176
    g = np.arange(np.prod(SHAPE), dtype=np.float64).reshape(SHAPE)
    for src in layouts:
        src_shards = scatter(g, src)
        for dst in layouts:
            plan, shards = run(src, dst, g, src_shards)
            if not dst.is_partial:
                for rank in MESH.ranks:  # each rank holds exactly its slice of the global array
                    assert_equal(shards[rank], g[dst.rank_slices(rank, SHAPE)], f"{src} -> {dst}, rank {rank}")
            assert_equal(gather(shards, dst, SHAPE), g, f"{src} -> {dst}: {plan}")


def test_random_pairs_with_max_min_avg_partials():
    layouts = all_layouts(ops=("sum", "max", "min", "avg"))
    rng = np.random.default_rng(1)
    g = rng.integers(-50, 50, size=SHAPE).astype(np.float64)
    for _ in range(3000):
        src, dst = layouts[rng.integers(len(layouts))], layouts[rng.integers(len(layouts))]
        _, shards = run(src, dst, g)
        np.testing.assert_allclose(gather(shards, dst, SHAPE), g, err_msg=f"{src} -> {dst}")


def test_shard_to_replicate_is_one_allgather():
    plan = plan_redistribution(MESH("a", None, None), MESH(None, None, None), SHAPE, "float32")
    assert plan.steps == [AllGather(0, 4 * 8 * 8 * 4, dim=0)]  # sends its 128-element shard once


def test_replicate_to_shard_is_a_free_local_slice():
    plan = plan_redistribution(MESH(None, None, None), MESH(None, "b", None), SHAPE, "float32")
    assert plan.steps == [LocalSlice(1, 0, dim=1)]
    assert plan.send_bytes == 0


def test_moving_shard_between_dims_is_one_alltoall():
    plan = plan_redistribution(MESH("c", None, None), MESH(None, None, "c"), SHAPE, "float16")
    local = 4 * 8 * 8 * 2
    assert plan.steps == [AllToAll(2, local // 2, split_dim=2, concat_dim=0)]


def test_partial_to_shard_is_one_reducescatter():
    src = TensorLayout(MESH, (None, None, None), partial={"b": "sum"})
    plan = plan_redistribution(src, MESH(None, None, "b"), SHAPE, "float32")
    full = 8 * 8 * 8 * 4
    assert plan.steps == [ReduceScatter(1, full // 2, dim=2, op="sum")]


def test_partial_to_shard_on_already_sharded_tensor():
    # The tensor is sharded on a and Partial on b; want it sharded (a, b) on dim 0.
    src = TensorLayout(MESH, ("a", None, None), partial={"b": "max"})
    plan = plan_redistribution(src, MESH(("a", "b"), None, None), SHAPE, "float32")
    assert [type(s) for s in plan] == [ReduceScatter] and plan[0].op == "max" and plan[0].dim == 0


def test_partial_to_replicate_is_one_allreduce():
    src = TensorLayout(MESH, (None, "a", None), partial={"c": "avg"})
    plan = plan_redistribution(src, MESH(None, "a", None), SHAPE, "float32")
    local = 8 * 4 * 8 * 4
    assert plan.steps == [AllReduce(2, 2 * local // 2, op="avg")]


def test_partial_kept_when_destination_is_same_partial():
    src = TensorLayout(MESH, (None, None, None), partial={"a": "sum"})
    dst = TensorLayout(MESH, ("b", None, None), partial={"a": "sum"})
    assert plan_redistribution(src, dst, SHAPE, "float32").kinds() == ["LocalSlice"]


def test_replicate_to_partial_is_local():
    dst = TensorLayout(MESH, (None, None, None), partial={"a": "sum"})
    plan = plan_redistribution(MESH(None, None, None), dst, SHAPE, "float32")
    assert plan.steps == [MakePartial(0, 0, op="sum")]


def test_slices_happen_before_gathers_to_keep_data_small():
    plan = plan_redistribution(MESH("a", None, None), MESH(None, "b", "a"), SHAPE, "float32")
    assert plan.kinds() == ["LocalSlice", "AllToAll"]


def test_mixed_partial_ops_rejected():
    with pytest.raises(ValueError, match="share one reduce op"):
        TensorLayout(MESH, (None,), partial={"a": "sum", "b": "max"})


def test_errors():
    other = Layout((8,), ("x",))
    with pytest.raises(ValueError, match="different meshes"):
        plan_redistribution(MESH("a"), other("x"), (8,), "float32")
    with pytest.raises(ValueError, match="has 2 dimensions but the tensor map"):
        plan_redistribution(MESH("a"), MESH(None), (3, 4), "float32")


def test_plan_repr_and_dtype_sizes():
    import mindspore as ms

    plan = plan_redistribution(MESH("a", None, None), MESH(None, None, None), SHAPE, ms.float16)
    assert plan.itemsize == 2
    assert "AllGather('a', dim=0)" in repr(plan)


def test_partial_reduced_before_gather_while_data_is_small():
    src = TensorLayout(MESH, ("a", None, None), partial={"b": "sum"})
    plan = plan_redistribution(src, MESH(None, None, None), SHAPE, "float32")
    assert plan.kinds() == ["AllReduce", "AllGather"]
    assert plan[0].send_bytes == 2 * (4 * 8 * 8 * 4) // 2
