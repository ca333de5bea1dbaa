"""Which nn.CellList a model is pipelined over: of several CellLists of as many Cells, the one the
forward calls (a text-only forward of a vision + language model), and never one nested in another's
blocks; a wrapper whose Cell owns a Parameter directly still gets a config's `pipeline: 2` stages.
Two lists the forward both calls are refused naming them."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, nn, ops

import mindspore_hyper as mh
from pipeline_models import assert_same_training, pipelined_and_reference
from pipeline_models import batch as paired_batch

pytestmark = pytest.mark.usefixtures("pynative")

CONFIG = {"parallel_config": {"device_matrix": [2], "alias_names": ["pipeline"],
                              "module_level": [{"name": "*", "strategy": {"pipeline": 2}}]}}


class Block(nn.Cell):
    """A residual Dense block holding a nested CellList of 2 Dense (not a chain candidate)."""

    def __init__(self, width):
        super().__init__()
        self.parts = nn.CellList([nn.Dense(width, width), nn.Dense(width, width)])

    def construct(self, x):
        return x + ops.tanh(self.parts[1](ops.tanh(self.parts[0](x))))


class TwoTowers(nn.Cell):
    """A vision tower (unused on this text-only forward, or used with `both`) and a text tower of 2 Blocks each,
    and a Parameter of its own (as a converted model's embedding table is)."""

    def __init__(self, width=8, both=False):
        super().__init__()
        self.vision = nn.CellList([Block(width) for _ in range(2)])
        self.text = nn.CellList([Block(width) for _ in range(2)])
        self.scale = Parameter(ms.Tensor(np.full((width,), 0.5, np.float32)), name="scale")
        self.both = both

    def construct(self, x):
        h = x * self.scale
        if self.both:
            for block in self.vision:
                h = block(h)
        for block in self.text:
            h = block(h)
        return h


class SquaredError(nn.Cell):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def construct(self, x, y):
        return ((self.lm(x) - y) ** 2).mean()


def batch():
    return paired_batch(4, seed=4, out=8)


def test_the_called_list_of_two_is_the_chain_and_trains_like_one_device():
    def parallelize(model):
        mh.set_context(mode="simulation", device_num=2)
        return mh.auto_parallelize(model, CONFIG)

    model, parallel, losses, reference = pipelined_and_reference(lambda: SquaredError(TwoTowers()), batch(),
                                                                 parallelize)
    assert parallel.layers.chain.path == "lm.text"
    assert parallel.layers.names == ("lm.text.0", "lm.text.1")
    assert "lm.scale" in {n for n, _ in parallel.stage_cells[0].parameters_and_names()}
    # bound: float32 Adam training of 8-wide Dense layers over 4 samples (tests/tolerances.py via the helper);
    # the unused vision tower has zero gradients in both runs
    assert_same_training(model, losses, reference, lr=1e-2, tokens=4)


def test_two_lists_both_called_are_refused_naming_them():
    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(SquaredError(TwoTowers(both=True)), CONFIG)
    with pytest.raises(ValueError, match=r"several nn.CellLists of 2 Cells and the forward calls 2 of them: "
                                         r"'lm.vision' \(2 block calls\), 'lm.text' \(2 block calls\)"):
        parallel.train_step(nn.Adam(parallel.optimizer_parameters(), 1e-2), *batch())
