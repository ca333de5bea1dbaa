"""tanh (function and module) and log1p, converted: float32 values and input gradients against the exact
function in NumPy float64.

On the CPU the mappings compute float32 inputs in float64 and round once (mappings.common.in_float64,
generated_support.exact_log1p), so every value and every gradient component is the float64 result rounded
to float32: within u = 2^-24 of itself (relative, elementwise), the float64 arithmetic adding ~1e-16. The
bound checked is 2u elementwise. MindSpore's own CPU float32 kernels are far outside it (tanh 1e-4 relative
to the largest value; log1p is log(1 + x), 0 for |x| < 6e-8), so each case fails with the plain mapping.
"""

import numpy as np
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.compare import to_mindspore

pytestmark = pytest.mark.usefixtures("pynative")

U = 2.0 ** -24  # float32's unit roundoff
BOUND = 2 * U


# name: (torch function of one input, input range (the interesting region: uniform on (-r, r); r = -1: log1p's
# magnitudes 1e-12 to 0.9 of either sign), exact value and derivative in float64 as functions of the input and
# the cotangent g: (value, gradient))
CASES = {
    "torch.tanh": (torch.tanh, 8.0, lambda x, g: (np.tanh(x), g * (1 - np.tanh(x) ** 2))),
    "nn.Tanh": (torch.nn.Tanh(), 8.0, lambda x, g: (np.tanh(x), g * (1 - np.tanh(x) ** 2))),
    "torch.log1p": (torch.log1p, -1.0, lambda x, g: (np.log1p(x), g / (1 + x))),
}


class _Each(torch.nn.Module):
    """Every case on its own input (so each input's gradient is that case's alone)."""

    def __init__(self):
        super().__init__()
        self.mods = torch.nn.ModuleDict({k.replace(".", "_"): f for k, (f, _, _) in CASES.items()
                                         if isinstance(f, torch.nn.Module)})

    def forward(self, *xs):
        outs = []
        for (name, (f, _, _)), x in zip(CASES.items(), xs):
            outs.append(self.mods[name.replace(".", "_")](x) if isinstance(f, torch.nn.Module) else f(x))
        return tuple(outs)


def _inputs(shape, seed):
    """Inputs spread uniformly over each case's range, with an exact zero and the range's end in them."""
    rng = np.random.RandomState(seed)
    xs = []
    for _, limit, _ in CASES.values():
        if limit < 0:
            x = (np.sign(rng.randn(*shape)) * 0.9 * 10.0 ** rng.uniform(-12, 0, shape)).astype(np.float32)
        else:
            x = rng.uniform(-limit, limit, shape).astype(np.float32)
        x.flat[0], x.flat[1] = 0.0, min(20.0, abs(limit))
        xs.append(torch.from_numpy(x))
    return xs


def _elementwise_error(got, want):
    return float(np.max(np.abs(got.astype(np.float64) - want) / np.maximum(np.abs(want), 1e-300)))


def test_float32_activations_are_the_rounded_float64_values_and_gradients():
    model = _Each()
    cell, _ = convert(model, _inputs((2, 8), 0))
    xs = _inputs((3, 5, 16), 1)  # a second shape
    rng = np.random.RandomState(2)
    cotangents = [rng.randn(*x.shape).astype(np.float32) for x in xs]
    inputs = [to_mindspore(x) for x in xs]
    weights = [ms.Tensor(g) for g in cotangents]
    outs = cell(*inputs)

    def weighted(*args):
        return sum((o * w).sum() for o, w in zip(cell(*args), weights))
    grads = ms.grad(weighted, grad_position=tuple(range(len(inputs))))(*inputs)
    errors = {}
    for (name, (_, _, exact)), x, g, out, grad in zip(CASES.items(), xs, cotangents, outs, grads):
        value, derivative = exact(x.numpy().astype(np.float64), g.astype(np.float64))
        errors[name] = (_elementwise_error(out.asnumpy(), value), _elementwise_error(grad.asnumpy(), derivative))
    bad = {k: v for k, v in errors.items() if not (v[0] <= BOUND and v[1] <= BOUND)}
    assert not bad, f"(value, gradient) errors above 2u = {BOUND:.2e}: {bad}"

