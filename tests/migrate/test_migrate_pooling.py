"""Functional pooling in the port (Funnel's `F.max_pool2d(x, stride, stride=stride, ceil_mode=True)` and its
average): the exported call carries its defaults as size lists (torch.fx's immutable lists), which are accepted
like plain ones. Exact ops on both sides (a maximum, a mean of 2 or 1 values), so the tolerance is migrate_models.TOL
with room to spare."""
import pytest
import torch
import torch.nn.functional as F

from mindspore_hyper.migrate import convert

from migrate_models import assert_same_outputs

pytestmark = pytest.mark.usefixtures("pynative")


class _Pooled(torch.nn.Module):
    def forward(self, x):  # x: (batch, 1, length, channels), pooled along the length as Funnel's encoder
        return F.max_pool2d(x, (2, 1), stride=(2, 1), ceil_mode=True) - F.avg_pool2d(-x, (2, 1), stride=(2, 1),
                                                                                     ceil_mode=True)


def test_functional_pooling_with_exported_default_lists_converts():
    torch.manual_seed(0)
    cell, report = convert(_Pooled(), torch.randn(2, 1, 8, 4))
    assert report.check["max_relative_error"] <= 1e-6
    assert_same_outputs(cell, _Pooled(), torch.randn(3, 1, 8, 4))
