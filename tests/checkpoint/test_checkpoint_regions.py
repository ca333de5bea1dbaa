"""Boxes, the pieces a target region takes from stored shards, and the byte runs of a piece:
checked against numpy slicing of C-ordered arrays."""
import itertools

import numpy as np
import pytest

from mindspore_hyper import Layout
from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.manifest import ShardEntry, TensorEntry
from mindspore_hyper.checkpoint.regions import byte_runs, pieces_of, rank_box


def gather_runs(array: np.ndarray, runs):
    raw = array.tobytes()
    return np.frombuffer(b"".join(raw[o:o + n] for o, n in runs), array.dtype)


@pytest.mark.parametrize("shape", [(), (7,), (4, 6), (3, 4, 5), (2, 3, 2, 4)])
def test_byte_runs_hold_exactly_the_part_in_c_order(shape):
    rng = np.random.default_rng(0)
    array = rng.standard_normal(shape).astype(np.float32)
    boxes = [Box.full(shape)]
    for _ in range(40):
        start = tuple(int(rng.integers(0, n)) for n in shape)
        stop = tuple(int(rng.integers(a + 1, n + 1)) for a, n in zip(start, shape))
        boxes.append(Box(start, stop))
    for box in boxes:
        runs = byte_runs(shape, 4, box)
        np.testing.assert_array_equal(gather_runs(array, runs), array[box.within(Box.full(shape))].ravel())
        assert sum(n for _, n in runs) == box.volume * 4  # not a byte more
        assert all(a + n < b for (a, n), (b, _) in zip(runs, runs[1:]))  # ascending, never touching


def test_byte_runs_merge_whole_trailing_dimensions():
    # rows 1..2 of a (4, 6) matrix: one run; columns 2..3: one run per row
    assert byte_runs((4, 6), 4, Box((1, 0), (3, 6))) == [(24, 48)]
    assert byte_runs((4, 6), 4, Box((0, 2), (4, 4))) == [(8, 8), (32, 8), (56, 8), (80, 8)]
    assert byte_runs((2, 3, 4), 2, Box((1, 0, 0), (2, 3, 4))) == [(24, 24)]


def test_box_algebra():
    a, b = Box((0, 2), (4, 6)), Box((2, 0), (8, 3))
    assert a.intersect(b) == Box((2, 2), (4, 3))
    assert a.intersect(Box((4, 0), (5, 6))) is None
    assert Box((0, 0), (8, 8)).contains(a) and not a.contains(b)
    assert Box((2, 2), (4, 3)).within(a) == (slice(2, 4), slice(0, 1))
    assert a.shape == (4, 4) and a.volume == 16 and Box((), ()).volume == 1
    assert Box.from_pairs(a.to_pairs()) == a
    assert not Box((0, 0), (4, 7)).fits((4, 6)) and not Box((0, 3), (4, 3)).fits((4, 6))


def entry_of(layout, shape):
    """A stored tensor laid out by `layout`, one shard per distinct region."""
    regions = {}
    for rank in layout.mesh.ranks:
        regions.setdefault(rank_box(layout, rank, shape), []).append(rank)
    shards = tuple(ShardEntry(box, f"rank_{r[0]}", "w", r[0], tuple(r)) for box, r in regions.items())
    return TensorEntry("w", shape, "Float32", layout.tensor_map, layout.ms_tensor_map, None, shards)


def test_pieces_tile_any_target_layout():
    shape = (8, 12)
    source = Layout((2, 4), ("a", "b"))
    target = Layout((3, 2), ("x", "y"))
    stored = entry_of(source("b", "a"), shape)
    for layout in [target(None, "y"), target("y", None), target(None, None), target("y", "x")]:
        for rank in target.ranks:
            want = rank_box(layout, rank, shape)
            pieces = pieces_of(stored, want)
            assert sum(p.part.volume for p in pieces) == want.volume
            for p, q in itertools.combinations(pieces, 2):
                assert p.part.intersect(q.part) is None
            for p in pieces:
                assert want.contains(p.part) and p.shard.box.contains(p.part)
                assert p.in_shard.shape == p.part.shape


def test_replicas_are_one_shard_written_by_the_lowest_rank():
    mesh = Layout((2, 2), ("data", "tensor"))
    stored = entry_of(mesh(None, "tensor"), (4, 4))
    assert [(s.writer, s.replicas) for s in stored.shards] == [(0, (0, 2)), (1, (1, 3))]


def test_uncovered_target_is_refused():
    stored = entry_of(Layout((2,), ("a",))("a"), (4,))
    broken = TensorEntry("w", (4,), "Float32", (), (), None, stored.shards[:1])
    with pytest.raises(CheckpointError, match="do not cover"):
        pieces_of(broken, Box((0,), (4,)))
