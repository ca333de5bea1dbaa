"""The layers of the pipeline tests' model (test_pipeline.py, pipeline_script.py): hidden blocks
and a loss head that needs no labels (upstream's pipelines send only activations between
stages, so the last stage's Cell computes the loss from its input alone)."""
from mindspore import nn, ops


class Block(nn.Cell):
    """A hidden layer (8 -> 8, tanh); `scale` (an optional second input) multiplies its output."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(8, 8, weight_init="normal", bias_init="normal")

    def construct(self, x, scale=None):
        y = ops.tanh(self.dense(x))
        return y if scale is None else y * scale


class Head(nn.Cell):
    """The last stage: a scalar loss of its microbatch (mean squared distance of a projection to 1)."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(8, 2, weight_init="normal")

    def construct(self, x):
        return ((self.dense(x) - 1.0) ** 2).mean()
