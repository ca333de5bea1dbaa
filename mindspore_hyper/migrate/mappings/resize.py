"""Resizing: bilinear upsampling to a given size (F.interpolate, aten.upsample_bilinear2d) -> ops.interpolate.

mint's interpolate has no CPU kernel for bilinear; ops.interpolate has, forward and backward. Only an explicit
output size is mapped: torch computes source coordinates from a given scale factor differently from one derived
from the size, so calls with scale factors are refused by name.
"""
import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call, expect
from mindspore_hyper.migrate.mappings.registry import Unsupported, function

aten = torch.ops.aten


def _bilinear(self, size, align_corners) -> str:
    return call("ops.interpolate", self, size=size, mode="'bilinear'",
                align_corners="True" if align_corners.const("align_corners") else "False")


@function("ops.interpolate (bilinear)", aten.upsample_bilinear2d)
def upsample_bilinear2d(self, output_size=None, align_corners=False, scales_h=None, scales_w=None,
                        scale_factors=None):
    if output_size.value is None or any(s is not None and s.value is not None for s in (scales_h, scales_w,
                                                                                      scale_factors)):
        raise Unsupported("upsample_bilinear2d with scale factors is not mapped (an output size is)")
    return _bilinear(self, output_size, align_corners)


@function("ops.interpolate (bilinear)", F.interpolate)
def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    expect(mode, ["bilinear"], "interpolate mode")
    expect(antialias, [False], "interpolate antialias")
    if size.value is None or scale_factor.value is not None:
        raise Unsupported("interpolate with a scale_factor is not mapped (a size is)")
    if input.ndim != 4:
        raise Unsupported(f"bilinear interpolate of a {input.ndim}-D input is not mapped (4-D is)")
    return _bilinear(input, size, align_corners)
