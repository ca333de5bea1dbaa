"""Pipelines of a model whose blocks return a tuple (an int also passed to the next block, the hidden
state, an attention-weights-like tensor, None), as converted transformers layers do, with the loop
taking element 1: the hidden state is the Tensor element the next block takes; 5 Adam steps equal
one device's. A model that uses another element after its block is refused naming the block and the
element, and a random forward (whose unused elements cannot be checked) is refused saying so."""
import pytest
from mindspore import nn, ops

from pipeline_models import assert_same_training, pipelined_and_reference
from pipeline_models import batch as paired_batch, pipelined_over_2

pytestmark = pytest.mark.usefixtures("pynative")


class TupleBlock(nn.Cell):
    """A residual Dense block returning (width, hidden, its pre-activation's softmax, None)."""

    def __init__(self, width):
        super().__init__()
        self.dense = nn.Dense(width, width)

    def construct(self, x, scale, width):
        pre = self.dense(x) * scale
        return width, x + ops.tanh(pre), ops.softmax(pre, -1), None


class TupleChain(nn.Cell):
    """Dense in, 4 TupleBlocks with side inputs, Dense out, squared-error loss. `use_extra`: the
    loss also sums every block's element 2 (which then must not be cut away)."""

    def __init__(self, width=8, depth=4, use_extra=False):
        super().__init__()
        self.inp = nn.Dense(width, width)
        self.blocks = nn.CellList([TupleBlock(width) for _ in range(depth)])
        self.out = nn.Dense(width, width)
        self.use_extra = use_extra

    def construct(self, x, y):
        h = self.inp(x)
        scale = ops.ones_like(x) * 0.5
        extra = 0.0
        for block in self.blocks:
            outputs = block(h, scale, 8)
            h = outputs[1]
            if self.use_extra:
                extra = extra + outputs[2].sum()
        return ((self.out(h) - y) ** 2).mean() + extra


def batch():
    return paired_batch(4, seed=3, out=8)


def pipelined(model):
    return pipelined_over_2(model)


def test_blocks_returning_a_tuple_train_like_one_device():
    model, parallel, losses, reference = pipelined_and_reference(TupleChain, batch(), pipelined)
    assert parallel.split == (2, 2)
    assert parallel.layers.chain.route.tuple_outputs[3][0] == 1  # the last block's hidden state: as block 2's
    # bound: float32 Adam training of 8-wide Dense layers over 4 samples (tests/tolerances.py via the helper)
    assert_same_training(model, losses, reference, lr=1e-2, tokens=4)


def test_a_tuple_element_used_after_its_block_is_refused_naming_it():
    parallel = pipelined(TupleChain(use_extra=True))
    with pytest.raises(ValueError, match=r"TupleChain\.blocks\[0\] returns a tuple whose element 2 is used after "
                                         r"the block.*only element 1, the hidden state"):
        parallel.train_step(nn.Adam(parallel.optimizer_parameters(), 1e-2), *batch())


class RandomTupleBlock(TupleBlock):
    """A TupleBlock whose attention-weights-like element goes through dropout (drawn anew each forward)."""

    def construct(self, x, scale, width):
        pre = ops.dropout(self.dense(x) * scale, p=0.5, training=True)
        return width, x + ops.tanh(pre), ops.softmax(pre, -1), None


def test_a_random_forward_with_tuple_blocks_is_refused_as_uncheckable():
    model = TupleChain()
    model.blocks = nn.CellList([RandomTupleBlock(8) for _ in range(4)])
    parallel = pipelined(model)
    with pytest.raises(ValueError, match=r"TupleChain's forward is random \(dropout\?\) and its blocks return tuples"):
        parallel.train_step(nn.Adam(parallel.optimizer_parameters(), 1e-2), *batch())
