"""glu (Wav2Vec2-Conformer's convolution module: a pointwise convolution doubling the channels, then nn.GLU(dim=1),
traced to aten.glu): converted, equal to torch at a second shape, values and the input's gradient."""
import pytest
import torch

from mindspore_hyper.migrate import convert

from migrate_models import TOL, assert_same_input_gradient, assert_same_outputs

pytestmark = pytest.mark.usefixtures("pynative")


class _GatedConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pointwise = torch.nn.Conv1d(4, 8, 1)
        self.glu = torch.nn.GLU(dim=1)

    def forward(self, x):
        return self.glu(self.pointwise(x.transpose(1, 2))).transpose(1, 2)


def test_glu_equals_torch_with_gradients():
    """Tolerance TOL (1e-5): a length-4 dot product, a sigmoid and a product in float32 (each within a few ulps,
    6e-8 each); splitting at the wrong half or gating the wrong half differs by O(1)."""
    torch.manual_seed(0)
    model = _GatedConv()
    cell, report = convert(model, torch.randn(2, 5, 4))
    assert report.check["max_relative_error"] <= TOL
    x = torch.randn(3, 7, 4)
    assert_same_outputs(cell, model, x)
    assert_same_input_gradient(cell, model, x)
