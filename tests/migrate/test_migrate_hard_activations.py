"""hardsigmoid and hardswish (PP-LCNet's squeeze-excitation gate and activation, nn.Hardsigmoid / nn.Hardswish
traced to aten): converted, equal to torch at a second shape, values and the input's gradient."""
import pytest
import torch

from mindspore_hyper.migrate import convert

from migrate_models import TOL, assert_same_input_gradient, assert_same_outputs

pytestmark = pytest.mark.usefixtures("pynative")


class _Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.gate, self.act = torch.nn.Hardsigmoid(), torch.nn.Hardswish()

    def forward(self, x):
        return self.act(self.proj(x) * 4) * self.gate(x * 4)


def test_hardsigmoid_and_hardswish_equal_torch_with_gradients():
    """Inputs scaled by 4 reach both kinks' sides (|x| > 3) and the linear middle. Tolerance TOL (1e-5): a length-4
    dot product and piecewise-linear ops in float32; a wrong piece or slope differs by O(1). Random inputs never
    hit the kinks (x = +-3 exactly) where MindSpore's hardswish gradient takes the other side's slope."""
    torch.manual_seed(0)
    model = _Gated()
    cell, report = convert(model, torch.randn(2, 5, 4))
    assert report.check["max_relative_error"] <= TOL
    x = torch.randn(3, 7, 4)
    assert_same_outputs(cell, model, x)
    assert_same_input_gradient(cell, model, x)
