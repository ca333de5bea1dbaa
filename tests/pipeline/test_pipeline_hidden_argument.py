"""Pipelines of a model whose blocks take the hidden state at different argument positions (a hybrid
converted model: an attention layer called (hidden, mask), the next kind (mask, hidden)): 5 Adam steps
equal one device's; a model whose blocks run twice (a recurrent-depth loop), one whose first block takes two
candidates for the hidden state, and one whose last block alone returns a tuple are refused saying so."""
import pytest
from mindspore import nn, ops

from pipeline_models import assert_same_training, pipelined_and_reference
from pipeline_models import batch as paired_batch, pipelined_over_2

pytestmark = pytest.mark.usefixtures("pynative")


class HiddenFirst(nn.Cell):
    def __init__(self, width):
        super().__init__()
        self.dense = nn.Dense(width, width)

    def construct(self, x, mask):
        return x + ops.tanh(self.dense(x)) * mask


class HiddenLast(HiddenFirst):
    def construct(self, mask, x):
        return x + ops.tanh(self.dense(x) * mask)


class Hybrid(nn.Cell):
    """Dense in, 4 blocks alternating HiddenFirst / HiddenLast with a mask side input, squared error;
    `twice`: the blocks run twice."""

    def __init__(self, width=8, twice=False):
        super().__init__()
        self.inp = nn.Dense(width, width)
        self.blocks = nn.CellList([HiddenFirst(width) if i % 2 == 0 else HiddenLast(width) for i in range(4)])
        self.twice = twice

    def construct(self, x, y):
        h = self.inp(x)
        mask = ops.ones_like(x) * 0.5
        for _ in range(2 if self.twice else 1):
            for i, block in enumerate(self.blocks):
                h = block(h, mask) if i % 2 == 0 else block(mask, h)
        return ((h - y) ** 2).mean()


def batch():
    return paired_batch(4, seed=5, out=8)


def pipelined(model):
    """Stage 1 starts at block 1, a HiddenLast: the received activation goes in as its second argument."""
    return pipelined_over_2(model, layers_per_stage=(1, 3))


def test_hidden_state_at_any_argument_position_trains_like_one_device():
    model, parallel, losses, reference = pipelined_and_reference(Hybrid, batch(), pipelined)
    assert parallel.layers.chain.route.hidden_args == [0, 1, 0, 1] and parallel.split == (1, 3)
    # bound: float32 Adam training of 8-wide Dense layers over 4 samples (tests/tolerances.py via the helper)
    assert_same_training(model, losses, reference, lr=1e-2, tokens=4)


def test_blocks_run_twice_are_refused_saying_so():
    parallel = pipelined(Hybrid(twice=True))
    with pytest.raises(ValueError, match=r"Hybrid.blocks is not a chain: block 0 is called 2 times \(the construct "
                                         r"runs its blocks more than once"):
        parallel.train_step(nn.Adam(parallel.optimizer_parameters(), 1e-2), *batch())


class LastOnlyTuple(nn.Cell):
    """Blocks returning a Tensor except the last, which returns (hidden, None)."""

    def __init__(self, width=8):
        super().__init__()
        self.blocks = nn.CellList([HiddenFirst(width) for _ in range(3)] + [TupleLast(width)])

    def construct(self, x, y):
        h, mask = x, ops.ones_like(x)
        for block in self.blocks:
            out = block(h, mask)
            h = out[0] if isinstance(out, tuple) else out
        return ((h - y) ** 2).mean()


class TupleLast(HiddenFirst):
    def construct(self, x, mask):
        return x + ops.tanh(self.dense(x)) * mask, None


class AmbiguousBlock(HiddenFirst):
    def construct(self, s, x, y):
        return x + ops.tanh(self.dense(y)) * s


class AmbiguousFirst(nn.Cell):
    """Block 0 is called (a (4, 1) scale, h, h * 2): two arguments of the output's shape, neither first."""

    def __init__(self, width=8):
        super().__init__()
        self.blocks = nn.CellList([AmbiguousBlock(width) for _ in range(4)])

    def construct(self, x, y):
        s = ops.ones((x.shape[0], 1), x.dtype)
        h = x
        for block in self.blocks:
            h = block(s, h, h * 2)
        return ((h - y) ** 2).mean()


@pytest.mark.parametrize("model, match", [
    (AmbiguousFirst, r"AmbiguousFirst.blocks\[0\] takes 2 Tensors of its output's shape \(2, 8\) \(arguments \[1, "
                     r"2\]\) and its first argument is not one"),
    (LastOnlyTuple, r"LastOnlyTuple.blocks\[3\] \(the last block\) returns a tuple of 2 but the block before does "
                    r"not return one of the same length"),
])
def test_an_unknown_hidden_state_position_is_refused_naming_the_block(model, match):
    parallel = pipelined(model())
    with pytest.raises(ValueError, match=match):
        parallel.train_step(nn.Adam(parallel.optimizer_parameters(), 1e-2), *batch())
