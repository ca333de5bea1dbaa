"""A module called more than once per forward (ModernBERT's and DeepSeek-V4's rotary embedding with another buffer
per call, Dory's final norm): the first call is the child's Cell, each later call its own ops in the parent reading
the child's parameters, so outputs and gradients equal torch's; a mapped layer called twice is one MindSpore layer
called twice. A LayerNorm without bias is converted from its traced program (nn.LayerNorm would train a beta).

Tolerance 1e-5 relative (migrate_models.TOL): float32 on both sides, reductions over <= 8 values (gamma_8 ~ 5e-7
each), a few dozen ops deep: far below it; a missed call or a wrong buffer gives errors of order 1."""
import numpy as np
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.compare import to_mindspore

from migrate_models import TOL, assert_same_outputs

pytestmark = pytest.mark.usefixtures("pynative")


class Rotary(torch.nn.Module):
    """Angles from one of two inverse-frequency buffers chosen by a string argument (as ModernBERT's)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("full_inv_freq", torch.tensor([1.0, 0.1]), persistent=False)
        self.register_buffer("local_inv_freq", torch.tensor([0.5, 0.05]), persistent=False)

    def forward(self, x, kind):
        angles = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * getattr(self, f"{kind}_inv_freq")
        return angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)


class Norm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Shared(torch.nn.Module):
    """Its rotary embedding, its norm and its Linear are each called twice."""

    def __init__(self):
        super().__init__()
        self.rotary, self.norm, self.proj = Rotary(), Norm(4), torch.nn.Linear(4, 4)

    def forward(self, x):
        cos_full, sin_full = self.rotary(x, "full")
        cos_local, sin_local = self.rotary(x, "local")
        h = self.proj(self.proj(self.norm(x) * cos_full + sin_local))
        return self.norm(h + cos_local) + sin_full


def test_a_module_called_twice_equals_torch_with_gradients():
    torch.manual_seed(0)
    model = Shared()
    cell, report = convert(model, torch.randn(2, 5, 4))
    assert report.check["max_relative_error"] <= TOL
    x = torch.randn(3, 7, 4)  # another batch and length: the later calls are shape-general too
    assert_same_outputs(cell, model, x)
    model(x).sum().backward()
    params = {n: p for n, p in cell.parameters_and_names()}
    weights = [params["norm.weight"], params["proj.weight"]]
    got = ms.grad(lambda a: cell(a).sum(), None, weights)(to_mindspore(x))
    for g, want in zip(got, (model.norm.weight.grad, model.proj.weight.grad)):  # both calls' contributions
        want = want.numpy()
        assert np.abs(g.asnumpy().reshape(want.shape) - want).max() <= TOL * np.abs(want).max()


def test_a_layer_norm_without_bias_trains_no_bias():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6, bias=False))
    cell, _ = convert(model, torch.randn(2, 4))
    trainable = sorted(p.name for p in cell.trainable_params())
    assert len(trainable) == len(list(model.parameters())) == 3, trainable  # no beta beside torch's weight
    assert_same_outputs(cell, model, torch.randn(5, 4))
