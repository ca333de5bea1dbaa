"""Small models for the pipeline tests, built from MindSpore's own layers (same seed -> same weights)."""
import os
import sys

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


def assert_same_training(model, losses, reference, atol=1e-6, loose=()):
    """Losses and parameters equal up to float32 rounding: each parameter's relative error (norm)
    <= 1e-5 and every element within `atol` (Adam turns rounding noise in near-zero gradients
    into steps of up to the learning rate's order, as on one device run twice in another order)."""
    ref_losses, ref_params = reference
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-7)
    for p in model.trainable_params():
        got, want = p.asnumpy(), ref_params[p.name]
        if p.name in loose:
            np.testing.assert_allclose(got, want, rtol=0, atol=loose[p.name], err_msg=p.name)
            continue
        assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want), p.name
        np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=p.name)


def gpt(seed: int = 0, layers: int = 4):
    """examples/models.py GPT, tiny: its construct passes a mask to every block of a CellList."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
    from models import GPT

    ms.set_seed(seed)
    return GPT(vocab=32, hidden=16, heads=2, layers=layers, seq=8)


def tokens(vocab: int = 32, shape=(4, 8), seed: int = 0):
    """Token ids and labels."""
    rng = np.random.default_rng(seed)
    return (Tensor(rng.integers(0, vocab, shape).astype(np.int32)),
            Tensor(rng.integers(0, vocab, shape).astype(np.int32)))
