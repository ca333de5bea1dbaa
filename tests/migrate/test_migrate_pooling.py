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


class _SqueezePooled(torch.nn.Module):
    """SEW's squeeze (`nn.AvgPool1d(k, k)` on (batch, channels, length)), and a padded functional form with
    ceil_mode and the padding left out of the divisor."""

    def __init__(self):
        super().__init__()
        self.pool = torch.nn.AvgPool1d(2, 2)

    def forward(self, x):
        return self.pool(x), F.avg_pool1d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False)


def test_avg_pool1d_converts_at_two_lengths():
    """Means of at most 3 values on both sides (float32): TOL (1e-5) with room to spare; a wrong window or divisor
    changes outputs by O(1)."""
    torch.manual_seed(0)
    cell, report = convert(_SqueezePooled(), torch.randn(2, 3, 8))
    assert report.check["max_relative_error"] <= 1e-6
    assert_same_outputs(cell, _SqueezePooled(), torch.randn(3, 3, 11))
