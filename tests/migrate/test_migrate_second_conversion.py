"""Two conversions in one process: the second converted model computes what torch does.

MindSpore 2.10's CPU Scatter kernel (mint.scatter, ops.scatter), once run on one shape, writes wrong
elements for later calls of other shapes; scatter was mapped to it, so converting the op zoo first
turned a DeepSeek-V3 router's group mask (zeros.scatter(1, group_index, 1)) wrong in the next
converted model. Scatter now maps to ops.tensor_scatter_elements, which keeps no such state.
"""
import pytest
import torch

from mindspore_hyper.migrate import convert

from migrate_models import assert_same_outputs

pytestmark = pytest.mark.usefixtures("pynative")


class ScatterLastDim(torch.nn.Module):
    """The op zoo's scatter: 1.0 and a tensor written at the top-2 positions of the last dimension."""

    def forward(self, x):
        index = torch.topk(x, 2).indices
        return torch.scatter(x, 2, index, 1.0), x.scatter(-1, index, x[..., :2] * 3)


class GroupMask(torch.nn.Module):
    """DeepSeek-V3's router group mask: 1 at each row's best group, of another rank and shape."""

    def forward(self, scores):
        group_index = torch.topk(scores, k=1, dim=-1).indices
        mask = torch.zeros_like(scores).scatter(1, group_index, 1)
        return mask, scores.scatter(1, group_index, scores[:, :1] - 5)


def test_second_conversion_scatters_like_torch_after_a_first_of_another_shape():
    torch.manual_seed(0)
    first = ScatterLastDim().eval()
    x = torch.randn(2, 4, 6)
    cell, _ = convert(first, x, tracer="fx", structure="flat")
    assert_same_outputs(cell, first, x, tol=0.0)  # copies of input elements and constants: exact
    second = GroupMask().eval()
    cell, _ = convert(second, torch.randn(10, 2), tracer="fx", structure="flat")
    for rows, groups in ((21, 2), (7, 3)):  # shapes neither conversion traced
        assert_same_outputs(cell, second, torch.randn(rows, groups), tol=0.0)  # exact, as above
