"""Layers of a degenerate size, which small configs produce: a pooling layer torch builds but cannot run (kernel 0:
Gemma 3's image pooling) becomes the `Unrunnable` helper (a model that never calls it converts; calling it raises,
as torch does); a Linear with 0 outputs (MobileBERT's `predictions.dense`, read only as a weight), which nn.Dense
refuses, is converted from its traced program with its empty parameter."""
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert

from migrate_models import assert_same_outputs


class _WithUnusedPool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)
        self.pool = torch.nn.AvgPool2d(kernel_size=0, stride=0)  # only an image input would reach it
        self.max_pool = torch.nn.MaxPool2d(kernel_size=(2, 0))

    def forward(self, x):
        return self.proj(x)


def test_model_with_an_unrunnable_pool_converts_and_the_pool_raises_as_in_torch():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    model = _WithUnusedPool().eval()
    cell, _ = convert(model, torch.randn(2, 5, 4))
    assert_same_outputs(cell, model, torch.randn(3, 7, 4))
    image = torch.randn(1, 2, 4, 4)
    for name in ("pool", "max_pool"):
        with pytest.raises(RuntimeError):
            getattr(model, name)(image)
        with pytest.raises(RuntimeError, match="torch raises when it is called"):
            getattr(cell, name)(ms.Tensor(image.numpy()))


class _EmptyLinear(torch.nn.Module):
    """MobileBERT's LM head: the decoder's weight extended by a Linear's weight of 0 rows (hidden == embedding)."""

    def __init__(self):
        super().__init__()
        self.decoder = torch.nn.Linear(6, 4, bias=False)
        self.dense = torch.nn.Linear(4, 0, bias=False)

    def forward(self, x):
        return x.matmul(torch.cat([self.decoder.weight.t(), self.dense.weight], dim=0))


def test_linear_with_zero_outputs_converts_from_its_program():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    model = _EmptyLinear().eval()
    cell, report = convert(model, torch.randn(2, 5, 6))
    assert "decoder" in report.layers and "dense" not in report.layers  # only the non-empty Linear is an nn.Dense
    assert_same_outputs(cell, model, torch.randn(3, 7, 6))
