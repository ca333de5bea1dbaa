"""Weight norm through torch.nn.utils.parametrizations (Hubert's positional convolution: `weight = g * v / ||v||`,
recomputed at each access from `parametrizations.weight.original0/1`) and ModuleDict containers: the parametrized
layer is converted from its traced program (a MindSpore layer would train the computed weight, not g and v), its
parametrizations become an nn.CellDict, and outputs and the gradients of g and v equal torch's.

Tolerance 1e-5 relative (migrate_models.TOL): float32 on both sides; the longest reduction is the norm over 32
values (gamma_32 ~ 2e-6) and the convolution's sums over 12, a few ops deep: below it; a norm over the wrong
dimensions or a missing g gives errors of order 1."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.compare import to_mindspore

from migrate_models import TOL, assert_same_outputs

pytestmark = pytest.mark.usefixtures("pynative")


class PosConv(torch.nn.Module):
    """Hubert's pattern: a weight-normed grouped Conv1d over (batch, length, channels), and a ModuleDict of heads."""

    def __init__(self, dim):
        super().__init__()
        conv = torch.nn.Conv1d(8, 8, 3, padding=1, groups=2)
        self.conv = torch.nn.utils.parametrizations.weight_norm(conv, name="weight", dim=dim)
        self.heads = torch.nn.ModuleDict({"gate": torch.nn.Linear(8, 8), "out": torch.nn.Linear(8, 4)})

    def forward(self, x):
        h = F.gelu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        return self.heads["out"](h * torch.sigmoid(self.heads["gate"](x)))


@pytest.mark.parametrize("dim", [2, 0, None])  # Hubert's (the last), the first, and None: over every dimension
def test_weight_norm_trains_g_and_v_as_torch(dim):
    torch.manual_seed(0)
    model = PosConv(dim)
    cell, report = convert(model, torch.randn(2, 5, 8))
    assert report.check["max_relative_error"] <= TOL
    params = {p.name: p for p in cell.trainable_params()}
    torch_params = dict(model.named_parameters())
    assert sorted(params) == sorted(torch_params)  # g and v under their torch names, no computed `weight`
    assert "conv.parametrizations.weight.original0" in params
    x = torch.randn(3, 7, 8)  # another batch and length
    assert_same_outputs(cell, model, x)
    model(x).square().sum().backward()
    names = sorted(torch_params)
    got = ms.grad(lambda a: ms.mint.sum(ms.mint.square(cell(a))), None, [params[n] for n in names])(to_mindspore(x))
    for name, g in zip(names, got):
        want = torch_params[name].grad.numpy()
        assert np.abs(g.asnumpy().reshape(want.shape) - want).max() <= TOL * np.abs(want).max(), name



class UnusedPosConv(torch.nn.Module):
    """Wav2Vec2-Conformer's pattern: a weight-normed convolution the forward never calls (relative positions replace
    it), so its parametrizations hold a plain ParametrizationList (a list with parameters of its own inside the
    ModuleDict); and an uncalled ModuleDict of a ModuleList."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(8, 8, 3, padding=1), dim=2)
        self.spare = torch.nn.ModuleDict({"blocks": torch.nn.ModuleList([torch.nn.Linear(8, 8)])})
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.proj(x)


def test_uncalled_weight_norm_keeps_its_parameters():
    """MindSpore's nn.CellDict refuses a CellList member: the converted Cell builds, holds g and v and the spare
    layer's weights under their torch names with torch's values, and its output equals torch's."""
    torch.manual_seed(0)
    model = UnusedPosConv()
    cell, report = convert(model, torch.randn(2, 5, 8))
    assert report.check["max_relative_error"] <= TOL
    params = {p.name: p for p in cell.get_parameters()}
    for name, value in model.named_parameters():
        assert np.array_equal(params[name].asnumpy().reshape(value.shape), value.detach().numpy()), name
    assert_same_outputs(cell, model, torch.randn(3, 7, 8))
