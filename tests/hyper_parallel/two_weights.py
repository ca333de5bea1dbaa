"""A Cell with a (5, 4) and a (7, 3) weight: rows that 2 and 4 devices split unevenly (shared by the
simulated test of uneven fully_shard pieces and the msrun worker `rank_checks.py`)."""
from mindspore import nn, ops


class TwoWeights(nn.Cell):
    """A (5, 4) and a (7, 3) weight side by side."""

    def __init__(self):
        super().__init__()
        self.five, self.seven = nn.Dense(4, 5), nn.Dense(3, 7)

    def construct(self, x, z):
        return ops.concat((ops.tanh(self.five(x)), ops.tanh(self.seven(z))), -1)
