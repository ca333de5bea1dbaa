"""Padded local storage (`dtensor/padded_storage.py`): a Parameter storing its piece with zero rows
after it reads as the piece, its padding gets a zero gradient, and writes pad the piece again.
(The msrun job checks it in use: `fully_shard` of 3 rows over 4 processes trains like one device,
tests/hyper_parallel/rank_checks.py.) Exact: a split and a concat move values, they add nothing."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor, ops

from mindspore_hyper.dtensor.padded_storage import is_padded, padded, padded_array, stored_piece


@pytest.mark.parametrize("rows", [0, 1, 2, 3])
def test_a_padded_parameter_reads_as_its_rows_and_its_padding_gets_no_gradient(pynative, rows):
    value = np.random.RandomState(0).randn(3, 4).astype(np.float32)
    param = Parameter(Tensor(value), name="w")
    piece = stored_piece(param, (rows, 4))
    assert tuple(piece.shape) == (rows, 4)
    np.testing.assert_array_equal(piece.asnumpy(), value[:rows])
    if rows == 3:
        assert piece is param  # no padding: the Parameter itself
    # an empty piece stays in the graph (a split, not a slice): its backward runs and gives zeros
    _, (grad,) = ms.value_and_grad(lambda: (ops.tanh(stored_piece(param, (rows, 4))) * 2).sum(),
                                   None, [param])()
    expected = np.zeros_like(value)
    expected[:rows] = 2 * (1 - np.tanh(value[:rows].astype(np.float64)) ** 2)
    # 2 (1 - t^2) with MindSpore's float32 t = tanh(x): t is off by a few ulp (<= ~3e-7 near 1),
    # moving 2 (1 - t^2) by 4 t dt <= ~1.2e-6; the padding rows must be exactly zero
    np.testing.assert_allclose(grad.asnumpy(), expected, rtol=0, atol=2e-6)
    assert not grad.asnumpy()[rows:].any()


def test_a_piece_written_back_is_padded_to_the_stored_rows(pynative):
    piece = Tensor(np.ones((1, 4), np.float32))
    stored = padded(piece, 2).asnumpy()
    np.testing.assert_array_equal(stored, [[1] * 4, [0] * 4])
    assert padded(piece, 1) is piece
    assert padded(Tensor(np.ones((0, 4), np.float32)), 1).asnumpy().tolist() == [[0.0] * 4]


def test_a_checkpoint_piece_is_padded_back_and_only_more_rows_count_as_padding():
    """A load pads the rows read from a checkpoint as the Parameter stores them (`padded_array`)."""
    piece = np.arange(4, dtype=np.float32).reshape(1, 4)
    np.testing.assert_array_equal(padded_array(piece, 2), [[0, 1, 2, 3], [0, 0, 0, 0]])
    assert padded_array(piece, 1) is piece
    assert padded_array(np.ones((0,), np.float32), 2).tolist() == [0.0, 0.0]
    assert is_padded((2, 4), (1, 4)) and is_padded((1,), (0,))
    assert not is_padded((2, 4), (2, 4)) and not is_padded((2, 4), (1, 3)) and not is_padded((), ())
    assert not is_padded((1, 4), (2, 4)) and not is_padded((2, 4, 1), (1, 4))
