"""Layout (mesh) and TensorLayout: validation, both views, shapes, slices, MindSpore interop."""
import numpy as np
import pytest

from mindspore_hyper.shard import Layout, Partial, Replicate, Shard, TensorLayout

MESH = Layout(device_matrix=(2, 2, 2), alias_names=("data", "tensor", "pipeline"))


def test_seed_worked_example_local_shape():
    tl = MESH("tensor", None, "pipeline", None)
    assert tl.local_shape((1024, 1024, 64, 64)) == (512, 1024, 32, 64)


def test_seed_worked_example_slices_of_each_rank():
    tl = MESH("tensor", None, "pipeline", None)
    shape = (1024, 1024, 64, 64)
    expected = {}
    for rank in range(8):
        t, p = (rank // 2) % 2, rank % 2  # coordinates (data, tensor, pipeline) = (rank // 4, t, p)
        expected[rank] = (slice(512 * t, 512 * (t + 1)), slice(0, 1024), slice(32 * p, 32 * (p + 1)), slice(0, 64))
    got = {rank: tl.rank_slices(rank, shape) for rank in range(8)}
    assert got == expected
    # data-axis neighbours hold identical copies
    assert tl.replica_ranks(0) == [0, 4]
    assert tl.replica_ranks(3) == [3, 7]
    assert MESH.coords(6) == (1, 1, 0)


def test_seed_example_three_entry_map_is_same_on_leading_dims():
    tl = MESH("tensor", None, "pipeline")
    assert tl.local_shape((1024, 1024, 64)) == (512, 1024, 32)


def test_positional_and_mindspore_keyword_forms():
    assert Layout((2, 4), ("dp", "mp")) == Layout(device_matrix=(2, 4), alias_name=("dp", "mp"))


@pytest.mark.parametrize("kwargs,match", [
    (dict(device_matrix=(2, 0), alias_names=("a", "b")), r"device_matrix\[1\]=0"),
    (dict(device_matrix=(2, 2.0), alias_names=("a", "b")), r"device_matrix\[1\]=2.0"),
    (dict(device_matrix=(), alias_names=()), "non-empty"),
    (dict(device_matrix=(2, 2), alias_names=("a",)), "expected 2 names"),
    (dict(device_matrix=(2, 2), alias_names=("a", "a")), "unique"),
    (dict(device_matrix=(2, 2), alias_names=("a", "")), r"alias_names\[1\]=''"),
    (dict(device_matrix=(2, 2), alias_names=("a", "None")), "reserved"),
    (dict(device_matrix=(2, 2), alias_names=("a", 3)), r"alias_names\[1\]=3"),
    (dict(device_matrix=(2, 2), alias_names=("a", "b"), rank_list=[0, 1, 2, 2]), "permutation of range"),
    (dict(device_matrix=(2, 2), alias_names=("a", "b"), rank_list=[0, 1, 2]), "permutation of range"),
])
def test_layout_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Layout(**kwargs)


def test_layout_has_no_side_effects_and_needs_no_init(monkeypatch):
    import mindspore.communication as comm
    import mindspore.communication.management as management

    def forbidden(*args, **kwargs):
        raise AssertionError("a Layout must not touch communication")

    for module in (comm, management):
        for name in ("init", "create_group"):
            monkeypatch.setattr(module, name, forbidden)
    mesh = Layout((4, 2), ("dp", "mp"), rank_list=[7, 6, 5, 4, 3, 2, 1, 0])
    tl = mesh("dp", "mp")
    assert tl.local_shape((8, 8)) == (2, 4)
    assert tl.to_mindspore().to_dict()["rank_list"] == [7, 6, 5, 4, 3, 2, 1, 0]


@pytest.mark.parametrize("tmap,match", [
    (("data", "data"), "used more than once"),
    (("data", ("tensor", "data")), "used more than once"),
    (("model",), r"tensor_map\[0\]='model'"),
    ((3,), r"tensor_map\[0\]=3"),
])
def test_tensor_map_validation(tmap, match):
    with pytest.raises(ValueError, match=match):
        MESH(*tmap)


def test_indivisible_shape_names_dimension_and_axis():
    with pytest.raises(ValueError, match=r"dimension 1 .* size 3, not divisible by 4 \(mesh axis dataxtensor = 4\)"):
        MESH(None, ("data", "tensor")).local_shape((8, 3))
    with pytest.raises(ValueError, match="has 2 dimensions but the tensor map"):
        MESH("data").local_shape((8, 8))


def test_placements_and_ms_tensor_map_views():
    tl = MESH(("data", "tensor"), None, "pipeline")
    assert tl.placements == (Shard(0), Shard(0), Shard(2))
    assert tl.ms_tensor_map == ((2, 1), -1, 0)
    tl2 = TensorLayout.from_placements(MESH, (Shard(1), Replicate(), Partial("sum")), ndim=2)
    assert tl2.tensor_map == (None, "data")
    assert tl2.partial == {2: "sum"}
    assert tl2.placements == (Shard(1), Replicate(), Partial("sum"))
    # round trip: placements -> layout -> placements
    assert TensorLayout.from_placements(MESH, tl.placements, 3) == tl


def test_tuple_entry_major_first():
    tl = MESH(("tensor", "data"))
    # rank 4 = coords (1,0,0): data=1, tensor=0 -> index tensor*2 + data = 1
    assert tl.shard_index(4, 0) == 1
    assert tl.rank_slices(4, (8,)) == (slice(2, 4),)
    assert tl.rank_slices(2, (8,)) == (slice(4, 6),)


def test_rank_list_permutes_devices():
    mesh = Layout((2, 2), ("dp", "mp"), rank_list=[3, 2, 1, 0])
    assert mesh.coords(3) == (0, 0)
    assert mesh.rank_at((1, 1)) == 0
    assert mesh("dp", "mp").rank_slices(3, (4, 4)) == (slice(0, 2), slice(0, 2))
    assert mesh.axis_group(3, ["mp"]) == [3, 2]


@pytest.mark.parametrize("tmap", [
    ("tensor", None, "pipeline", None), (("data", "tensor"), None), (None, None), ("pipeline",),
    (("pipeline", "data"), "tensor"),
])
def test_to_mindspore_matches_mindspore_layout(tmap):
    from mindspore.parallel import Layout as MsLayout

    ms_mesh = MsLayout((2, 2, 2), ("data", "tensor", "pipeline"))
    expected = ms_mesh(*["None" if e is None else e for e in tmap]).to_dict()
    got = MESH(*tmap).to_mindspore().to_dict()
    assert got == expected
    assert MESH(*tmap).ms_tensor_map == expected["tensor_map"]


def test_partial_cannot_go_to_mindspore():
    tl = TensorLayout(MESH, ("data", None), partial={"tensor": "sum"})
    with pytest.raises(ValueError, match="Partial"):
        tl.to_mindspore()
    with pytest.raises(ValueError, match="already shards"):
        TensorLayout(MESH, ("data",), partial={"data": "sum"})
    with pytest.raises(ValueError, match="expected one of"):
        TensorLayout(MESH, ("data",), partial={"tensor": "prod"})


def test_every_rank_slice_tiles_the_tensor():
    shape = (4, 8, 6)
    for tmap in [("data", ("tensor", "pipeline"), None), (None, "pipeline", "tensor"), ("tensor", None, None)]:
        tl = MESH(*tmap)
        count = np.zeros(shape, dtype=int)
        for rank in range(8):
            count[tl.rank_slices(rank, shape)] += 1
        replicas = 8 // np.prod([tl.shard_count(d) for d in range(3)])
        assert (count == replicas).all()


def test_uneven_dimensions_split_as_torch_chunk_axis_by_axis():
    """Against torch.chunk itself (applied mesh axis by mesh axis, major first, as torch's
    DTensor does): which rows each rank holds, the largest shard, the even path unchanged."""
    import torch

    from mindspore_hyper.shard.chunking import chunk_sizes

    for size in range(0, 11):
        for pieces in range(1, 6):
            expected = [len(c) for c in torch.arange(size).chunk(pieces)] if size else []
            expected += [0] * (pieces - len(expected))  # torch.chunk drops trailing empty chunks
            assert list(chunk_sizes(size, pieces)) == expected, (size, pieces)
    layout = MESH(None, ("data", "tensor"))  # dimension 1 over 2 x 2, data major
    rows = torch.arange(5)
    for rank in MESH.ranks:
        data, tensor = MESH.coords(rank)[MESH.axis_index("data")], MESH.coords(rank)[MESH.axis_index("tensor")]
        outer = rows.chunk(2)[data] if data < len(rows.chunk(2)) else rows[:0]
        inner = outer.chunk(2)
        want = inner[tensor] if tensor < len(inner) else rows[:0]
        got = layout.rank_slices(rank, (3, 5))[1]
        assert list(range(5))[got] == want.tolist()
        assert layout.shard_shape((3, 5), MESH.coords(rank)) == (3, len(want))
    assert layout.max_local_shape((3, 5)) == (3, 2) and layout.uneven_dims((3, 5)) == (1,)
    assert not layout.is_even((3, 5)) and layout.is_even((3, 8))
    assert layout.rank_slices(MESH.rank_at((1, 1, 0)), (3, 8)) == (slice(0, 3), slice(6, 8))  # even: 4th quarter
    with pytest.raises(ValueError, match="not divisible by 4"):
        layout.local_shape((3, 5))  # the even-only view still refuses
