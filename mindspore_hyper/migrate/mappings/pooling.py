"""Pooling and flattening: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten (modules and functions), avg_pool1d."""
import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call, expect
from mindspore_hyper.migrate.mappings.registry import Unsupported, function, module

aten = torch.ops.aten


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _pool_padding(padding) -> str:
    top_bottom, left_right = _pair(padding)
    if top_bottom == left_right == 0:
        return "pad_mode='valid'"
    return f"pad_mode='pad', padding=({top_bottom}, {left_right})"


def _unrunnable(m, stride):
    """The `Unrunnable` helper's constructor when torch cannot run `m` (a kernel or stride of 0), else None."""
    if 0 in _pair(m.kernel_size) + _pair(stride):
        reason = (f"{type(m).__name__}(kernel_size={m.kernel_size}, stride={stride}): torch raises when it is called "
                  "(a kernel or stride of 0)")
        return f"Unrunnable({reason!r})"
    return None


@module(torch.nn.MaxPool2d, "nn.MaxPool2d")
def max_pool2d_module(m: torch.nn.MaxPool2d) -> str:
    stride = m.stride if m.stride is not None else m.kernel_size
    if _unrunnable(m, stride):
        return _unrunnable(m, stride)
    if m.return_indices or _pair(m.dilation) != (1, 1):
        raise Unsupported("nn.MaxPool2d with return_indices or dilation is not mapped")
    return (f"nn.MaxPool2d(kernel_size={_pair(m.kernel_size)}, stride={_pair(stride)}, {_pool_padding(m.padding)}, "
            f"ceil_mode={m.ceil_mode})")


@module(torch.nn.AvgPool2d, "nn.AvgPool2d")
def avg_pool2d_module(m: torch.nn.AvgPool2d) -> str:
    if m.divisor_override is not None:
        raise Unsupported("nn.AvgPool2d(divisor_override=...) is not mapped")
    stride = m.stride if m.stride is not None else m.kernel_size
    if _unrunnable(m, stride):
        return _unrunnable(m, stride)
    return (f"nn.AvgPool2d(kernel_size={_pair(m.kernel_size)}, stride={_pair(stride)}, {_pool_padding(m.padding)}, "
            f"ceil_mode={m.ceil_mode}, count_include_pad={m.count_include_pad})")


@module(torch.nn.AdaptiveAvgPool2d, "nn.AdaptiveAvgPool2d")
def adaptive_avg_pool2d_module(m: torch.nn.AdaptiveAvgPool2d) -> str:
    return f"nn.AdaptiveAvgPool2d({_pair(m.output_size)})"


@module(torch.nn.Flatten, "nn.Flatten")
def flatten_module(m: torch.nn.Flatten) -> str:
    return f"nn.Flatten(start_dim={m.start_dim}, end_dim={m.end_dim})"


@function("ops.max_pool2d", aten.max_pool2d)
def max_pool2d(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    expect(dilation, (1, [1, 1], (1, 1)), "dilation")
    kernel = _pair(kernel_size.const("kernel_size"))
    steps = stride.const("stride")
    return call("ops.max_pool2d", self, kernel, _pair(steps) if steps else kernel, _pair(padding.const("padding")),
                ceil_mode=ceil_mode)


@function("ops.max_pool2d", F.max_pool2d)
def max_pool2d_functional(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                          return_indices=False):
    expect(return_indices, (False,), "return_indices")
    return max_pool2d(input, kernel_size, stride if stride.value is not None else kernel_size, padding, dilation,
                      ceil_mode)


@function("ops.avg_pool2d", aten.avg_pool2d, F.avg_pool2d)
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    expect(divisor_override, (None,), "divisor_override")
    kernel = _pair(kernel_size.const("kernel_size"))
    steps = stride.const("stride")
    top_bottom, left_right = _pair(padding.const("padding"))
    return call("ops.avg_pool2d", self, kernel, _pair(steps) if steps else kernel,
                (top_bottom, top_bottom, left_right, left_right), ceil_mode=ceil_mode,
                count_include_pad=count_include_pad)


def _single(v) -> int:
    """One length from torch's 1-d pooling arguments (an int or a 1-element list)."""
    return v[0] if isinstance(v, (tuple, list)) else v


@function("ops.avg_pool1d", aten.avg_pool1d, F.avg_pool1d)
def avg_pool1d(self=None, kernel_size=None, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               input=None):
    # SEW's squeeze pooling (nn.AvgPool1d traced); the same windows, padding and divisor as torch (measured equal,
    # with ceil_mode and count_include_pad, values and gradients)
    tensor = self if self is not None and (self.is_tensor or self.value is not None) else input
    kernel = _single(kernel_size.const("kernel_size"))
    steps = stride.const("stride") if stride is not None else None
    return call("ops.avg_pool1d", tensor, kernel, _single(steps) if steps else kernel,
                _single(padding.const("padding")), ceil_mode, count_include_pad)


@function("ops.adaptive_avg_pool2d", aten.adaptive_avg_pool2d, F.adaptive_avg_pool2d)
def adaptive_avg_pool2d(self, output_size):
    return call("ops.adaptive_avg_pool2d", self, _pair(output_size.const("output_size")))


@function("mint.mean (output size 1)", aten.adaptive_avg_pool1d, F.adaptive_avg_pool1d)
def adaptive_avg_pool1d(self=None, output_size=None, input=None):
    # the whole length averaged (a pooler's global average); other output sizes are not mapped
    tensor = self if self is not None and (self.is_tensor or self.value is not None) else input
    size = output_size.const("output_size")
    if size not in (1, (1,), [1]):
        raise Unsupported(f"adaptive_avg_pool1d(output_size={size!r}) is not mapped (only 1: the global average)")
    return call("mint.mean", tensor, dim=-1, keepdim=True)
