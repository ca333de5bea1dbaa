"""Complex values as (real, imaginary) pairs (complex_pairs.py): Llama 4's complex rotary embedding converted and
checked against torch at a second shape, in training too; complex ops outside the pair form, and complex model
outputs, refused by name."""
import numpy as np
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.errors import UnsupportedOpError

from migrate_models import assert_same_outputs
from migrate_training import train_both


class _ComplexRope(torch.nn.Module):
    """Llama 4's rotary frequencies: polar(1, position x inverse frequency), scaled (a complex module output)."""

    def __init__(self, dim):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim), persistent=False)

    def forward(self, x):
        freqs = torch.arange(x.shape[1], dtype=torch.float32)[None, :, None] * self.inv_freq
        return torch.polar(torch.ones_like(freqs), freqs) * 0.5


class _Rotated(torch.nn.Module):
    """Llama 4's apply_rotary_emb on a projection (view_as_complex, complex product, view_as_real), and shape ops,
    real/imag and conj on complex values with negative dimensions (the renumbering)."""

    def __init__(self, dim):
        super().__init__()
        self.q = torch.nn.Linear(dim, dim)

    def forward(self, x, freqs_cis):
        q = self.q(x).float()
        rotated = torch.view_as_complex(q.reshape(*q.shape[:-1], -1, 2)) * freqs_cis  # [B, T, D/2]
        moved = rotated.transpose(-1, -2).unsqueeze(-1)[..., 0].transpose(-2, -1)  # the same values, moved back
        extra = torch.real(moved) * torch.imag(rotated.conj()) - torch.imag(moved * moved)
        return torch.view_as_real(rotated).flatten(2) + torch.cat([extra, extra], -1)


class _Model(torch.nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.rope, self.attn = _ComplexRope(dim), _Rotated(dim)

    def forward(self, x):
        return self.attn(x, self.rope(x))


def test_complex_rotary_matches_torch_at_a_second_shape_and_in_training():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    model = _Model()
    cell, report = convert(model, torch.randn(2, 5, 8))
    assert any("complex values computed as (real, imaginary) pairs" in n and "aten.polar" in n for n in report.notes)
    assert any("aten.view_as_complex" in n and "aten.mul" in n for n in report.notes)
    # float32 throughout; the outputs are O(1) sums of a few products, the default 1e-5 relative is ~100 u
    assert_same_outputs(cell, model, torch.randn(3, 9, 8))
    batches = [(torch.randn(2, 5, 8),), (torch.randn(3, 7, 8),), (torch.randn(2, 6, 8),)]
    # mean squared distance from 0.5: a few products per value and a mean over <= 168 values (the same 1e-5)
    want, got = train_both(model, cell, batches, lambda out, b: ((out - 0.5) ** 2).mean(),
                           lambda out, b: ((out - 0.5) ** 2).mean())
    assert np.allclose(got, want, rtol=1e-5, atol=0)


def test_complex_rotary_in_the_flat_export_trace():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    model = _Model()
    x = torch.randn(2, 5, 8)
    cell, report = convert(model, x, structure="flat", tracer="export")  # one graph: the same pass
    assert any("attn (_Rotated), rope (_ComplexRope): complex values computed" in n for n in report.notes)
    assert_same_outputs(cell, model, torch.randn(2, 5, 8))  # the flat export is specialised to the shape


class _ComplexExp(torch.nn.Module):
    def forward(self, x):
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(torch.exp(z)).flatten(-2)


class _ComplexOut(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * 2.0


@pytest.mark.parametrize("model,message", [
    (_ComplexExp(), "aten.exp on a complex value is not converted"),
    (_ComplexOut(), "the model returns a complex tensor"),
])
def test_complex_cases_outside_the_pair_form_are_refused_by_name(model, message):
    with pytest.raises(UnsupportedOpError, match=message):
        convert(model, torch.randn(2, 3, 4))
