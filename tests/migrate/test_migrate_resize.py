"""Bilinear resizing (F.interpolate / aten.upsample_bilinear2d) -> ops.interpolate: a size read at run time
converts shape-general; scale factors and other modes are refused by name."""
import pytest
import torch
import torch.nn.functional as F
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.errors import UnsupportedOpError

from migrate_models import assert_same_outputs


class _Resize(torch.nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, x):
        if self.options:
            return F.interpolate(x, **self.options)
        return F.interpolate(x, size=(x.shape[2] * 2, 5), mode="bilinear") + 1  # MobileViT: sizes from the input


def test_bilinear_resize_to_a_size_read_at_run_time_is_shape_general():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    cell, _ = convert(_Resize(), torch.randn(2, 3, 4, 6))
    assert_same_outputs(cell, _Resize(), torch.randn(3, 3, 7, 5))


@pytest.mark.parametrize("options,message", [
    ({"scale_factor": 2.0, "mode": "bilinear"}, "with scale factors is not mapped"),
    ({"size": (6, 6), "mode": "nearest"}, "upsample_nearest2d: no MindSpore mapping"),
])
def test_unmapped_resizes_are_refused_by_name(options, message):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    with pytest.raises(UnsupportedOpError, match=message):
        convert(_Resize(**options), torch.randn(2, 3, 4, 6))
