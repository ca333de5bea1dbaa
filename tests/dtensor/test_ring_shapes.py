"""The dry run's ring (`ring_shapes`): causal (diagonal) masks known from positions alone (the
recognition is exact: the structure rebuilds the mask entry for entry), the blocks it skips equal
the ones the simulation's ring finds by reading every value (for the scales, masks and chunk
counts below), and mixed dtypes refused."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from mindspore_hyper.dtensor.context_parallel.diagonal_mask import diagonal_of, recognise
from mindspore_hyper.dtensor.context_parallel.ring import _empty_blocks
from mindspore_hyper.dtensor.context_parallel.ring_shapes import check_dtypes, empty_blocks
from mindspore_hyper.dtensor.context_parallel.scores import Step
from mindspore_hyper.dtensor.meta import meta


def _causal(t, s, k=1, value=-1e9):
    return np.triu(np.full((t, s), value, np.float32), k)


def _distances(t, s):
    return np.arange(s)[None, :] - np.arange(t)[:, None]


DIAGONAL = {
    "GPT causal": _causal(8, 8),
    "diagonal masked too": _causal(8, 8, 0),
    "offset 3": _causal(6, 6, 3),
    "below the diagonal": _causal(6, 6, -2),
    "-inf": _causal(5, 5, 1, -np.inf),
    "keep (bool tril)": np.tril(np.ones((6, 6), np.bool_)),
    "fill (bool, negated tril)": ~np.tril(np.ones((6, 6), np.bool_)),
    "wide, bottom-right aligned": _causal(4, 12, 9),
    "tall": _causal(12, 4, 1),
    "one column": _causal(5, 1, -2),
    "constant zeros": np.zeros((4, 4), np.float32),
    "leading dims alike": np.broadcast_to(_causal(6, 6), (2, 3, 6, 6)).copy(),
}


@pytest.mark.parametrize("name", list(DIAGONAL))
def test_a_diagonal_mask_is_rebuilt_from_its_structure_exactly(name):
    mask = DIAGONAL[name]
    structure = recognise(mask)
    assert structure is not None
    t, s = mask.shape[-2:]
    rebuilt = structure.at(_distances(t, s))
    assert rebuilt.dtype == mask.dtype and np.array_equal(rebuilt, mask.reshape((-1, t, s))[0])


def test_other_masks_are_not_diagonal():
    rng = np.random.default_rng(0)
    differing = np.stack([_causal(6, 6), _causal(6, 6, 2)])
    two_steps = _causal(6, 6) + _causal(6, 6, 3)  # three values
    padding = np.zeros((6, 6), np.float32)
    padding[:, 4:] = -1e9  # masked columns: not a function of col - row
    nan = _causal(4, 4)
    nan[0, 0] = np.nan
    for mask in (differing, two_steps, padding, nan, np.where(rng.random((6, 6)) < 0.4, -1e9, 0.0),
                 np.zeros((6,), np.float32), np.zeros((0, 4), np.float32)):
        assert recognise(mask) is None


def test_a_constant_is_read_once():
    constant = Tensor(_causal(8, 8))
    first = diagonal_of(constant)
    assert first is not None and diagonal_of(constant) is first and diagonal_of(None) is None


CASES = {  # name: (steps with their masks, t, s, chunk counts)
    "GPT: scale then causal add": ([("div", 2 ** 0.5, None), ("add", 0, _causal(8, 8))], 8, 8, (1, 2, 4, 8)),
    "scale then -inf fill": ([("mul", 0.5, None), ("fill", -np.inf, DIAGONAL["fill (bool, negated tril)"])],
                             6, 6, (2, 3, 6)),
    "add then a scale lifting it above the threshold": ([("add", 0, _causal(8, 8)), ("mul", 0.05, None)], 8, 8,
                                                        (2, 4, 8)),
    "two diagonals": ([("add", 0, _causal(12, 12, 2)), ("add", 0, _causal(12, 12, -1, -1e3))], 12, 12, (2, 3, 4, 6)),
    "wide": ([("add", 0, _causal(4, 12, 9))], 4, 12, (2, 4)),
    "zeros": ([("add", 0, np.zeros((4, 4), np.float32))], 4, 4, (2, 4)),
    "leading dims": ([("div", 2.0, None), ("add", 0, DIAGONAL["leading dims alike"])], 6, 6, (2, 3, 6)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_blocks_from_positions_equal_blocks_from_values(name):
    """`ring_shapes.empty_blocks` (structure) against `ring._empty_blocks` (every value, what the
    simulation runs): both apply the same float32 steps entry by entry, so they must agree exactly."""
    specs, t, s, chunk_counts = CASES[name]
    steps = [Step(kind, value) for kind, value, _ in specs]
    masks = [None if m is None else Tensor(m) for _, _, m in specs]
    structures = [None if m is None else recognise(m) for _, _, m in specs]
    found_any = False
    for chunks in chunk_counts:
        expected = _empty_blocks(masks, [(step, None) for step in steps], chunks, t, s)
        assert np.array_equal(empty_blocks(structures, steps, chunks, t, s), expected), chunks
        found_any |= bool(expected.any())
    assert found_any == (name not in ("zeros", "add then a scale lifting it above the threshold"))


def test_mixed_dtypes_are_refused():
    q, half = meta((2, 4, 2), ms.float32), meta((2, 2, 4), ms.float16)
    with pytest.raises(ValueError, match=r"dry run: ring attention over 'cp' with q, k, v and additive masks of "
                                         r"dtypes \['Float16', 'Float32'\]"):
        check_dtypes(q, half, q, [], "cp")
    with pytest.raises(ValueError, match=r"dtypes \['Float16', 'Float32'\]"):
        check_dtypes(q, q, q, [Step("add", mask=meta((4, 4), ms.float16))], "cp")
    check_dtypes(q, q, q, [Step("div", 2.0), Step("add", mask=meta((4, 4), ms.float32)),
                           Step("fill", -1.0, meta((4, 4), ms.bool_))], "cp")  # one dtype (a fill mask's is its own)
