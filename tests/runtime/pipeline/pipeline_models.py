"""Small models for the pipeline tests, built from MindSpore's own layers (same seed -> same weights)."""
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn


def dense_chain(width: int = 16, depth: int = 4, seed: int = 1) -> nn.WithLossCell:
    """nn.SequentialCell of Dense / ReLU / Tanh under nn.WithLossCell(MSELoss)."""
    ms.set_seed(seed)
    np.random.seed(seed)
    layers = [nn.Dense(8, width), nn.ReLU()]
    for i in range(depth - 2):
        layers += [nn.Dense(width, width), nn.Tanh() if i % 2 else nn.ReLU()]
    layers.append(nn.Dense(width, 4))
    return nn.WithLossCell(nn.SequentialCell(layers), nn.MSELoss())


def batch(n: int = 8, seed: int = 2):
    rng = np.random.default_rng(seed)
    return (Tensor(rng.standard_normal((n, 8)).astype(np.float32)),
            Tensor(rng.standard_normal((n, 4)).astype(np.float32)))


def single_device_run(model, x, y, steps: int = 5, lr: float = 1e-2):
    """Losses and final parameters of plain MindSpore training (nn.Adam, TrainOneStepCell)."""
    step = nn.TrainOneStepCell(model, nn.Adam(model.trainable_params(), lr))
    losses = [float(step(x, y).asnumpy()) for _ in range(steps)]
    return losses, {p.name: p.asnumpy().copy() for p in model.trainable_params()}
