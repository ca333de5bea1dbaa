"""Fourier transforms: fftn (FNet's token mixing) -> ops.fftn, and the real part of a complex tensor -> ops.real.

ops.fftn has a CPU kernel with a gradient; the complex result is only used through its real part in the models
swept, so these two are what is mapped.
"""
import torch

from mindspore_hyper.migrate.mappings.common import call
from mindspore_hyper.migrate.mappings.registry import function

aten = torch.ops.aten


@function("ops.fftn", aten.fft_fftn, torch.fft.fftn, names=["aten.fft_fftn", "torch.fft.fftn"])
def fftn(self, s=None, dim=None, norm=None):
    return call("ops.fftn", self, s=s, dim=dim, norm=norm)


@function("ops.real", aten.real, torch.real)
def real(self):
    return call("ops.real", self)
