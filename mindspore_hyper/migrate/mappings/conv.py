"""Convolutions: nn.Conv1d/nn.Conv2d -> nn.Conv1d/nn.Conv2d (pad_mode="pad"), functional conv1d/conv2d."""
import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call
from mindspore_hyper.migrate.mappings.registry import Unsupported, function, module

aten = torch.ops.aten


def _padding(m) -> str:
    """MindSpore pad_mode/padding arguments of a torch conv module."""
    if m.padding_mode != "zeros":
        raise Unsupported(f"{type(m).__name__}(padding_mode={m.padding_mode!r}): only 'zeros' padding is mapped")
    if isinstance(m.padding, str):
        return f"pad_mode={m.padding!r}"
    if len(m.padding) == 1:
        return f"pad_mode='pad', padding={m.padding[0]}"
    top_bottom, left_right = m.padding
    return f"pad_mode='pad', padding=({top_bottom}, {top_bottom}, {left_right}, {left_right})"


def _conv(m, cls: str) -> str:
    def one(v):
        return v[0] if len(v) == 1 else tuple(v)

    return (f"nn.{cls}({m.in_channels}, {m.out_channels}, {one(m.kernel_size)}, stride={one(m.stride)}, "
            f"{_padding(m)}, dilation={one(m.dilation)}, group={m.groups}, has_bias={m.bias is not None})")


@module(torch.nn.Conv1d, "nn.Conv1d", params={"weight": "weight", "bias": "bias"}, relaid=("weight",))
def conv1d_module(m: torch.nn.Conv1d) -> str:
    # MindSpore keeps the weight as (out, in/groups, 1, k): the state-dict layout rule inserts the 1.
    return _conv(m, "Conv1d")


@module(torch.nn.Conv2d, "nn.Conv2d", params={"weight": "weight", "bias": "bias"})
def conv2d_module(m: torch.nn.Conv2d) -> str:
    return _conv(m, "Conv2d")


def _ints(arg):
    """An int or a tuple of ints (MindSpore refuses lists here)."""
    value = arg.const(arg.code)
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _functional_conv(fn: str, input, weight, bias, stride, padding, dilation, groups) -> str:
    stride, dilation = _ints(stride), _ints(dilation)
    pad = padding.const("padding")
    if isinstance(pad, str):
        return call(fn, input, weight, bias, stride=stride, pad_mode=repr(pad), dilation=dilation, groups=groups)
    pad = tuple(pad) if isinstance(pad, (list, tuple)) else (pad,)
    padding_code = pad[0] if len(pad) == 1 else pad  # ops.conv2d takes (height, width) padding
    return call(fn, input, weight, bias, stride=stride, pad_mode="'pad'", padding=padding_code, dilation=dilation,
                groups=groups)


@function("ops.conv2d", F.conv2d, aten.conv2d)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _functional_conv("ops.conv2d", input, weight, bias, stride, padding, dilation, groups)


@function("ops.unfold", F.unfold, aten.im2col)
def im2col(input=None, kernel_size=None, dilation=1, padding=0, stride=1, self=None):
    # torch.nn.functional.unfold (sliding blocks of a 4-D input as columns); mint's Im2ColExt has no CPU kernel
    return call("ops.unfold", input if self is None or self.value is None and not self.is_tensor else self, _ints(kernel_size), dilation=_ints(dilation), padding=_ints(padding),
                stride=_ints(stride))


@function("ops.conv2d (over a unit height)", aten.conv1d, F.conv1d)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    # mint's conv1d has no CPU kernel: (N, C, L) as (N, C, 1, L), the weight (O, C/g, k) as (O, C/g, 1, k)
    if input.ndim != 3:
        raise Unsupported(f"conv1d of a {input.ndim}-d input is not mapped (only batched: N, C, L)")
    one = lambda arg: (lambda v: v[0] if isinstance(v, tuple) else v)(_ints(arg))  # noqa: E731
    pad = padding.const("padding")
    if isinstance(pad, str):
        extra = dict(pad_mode=repr(pad))
    else:
        p = one(padding)
        extra = dict(pad_mode="'pad'", padding=(0, p))  # (height, width)
    out = call("ops.conv2d", call("mint.unsqueeze", input, 2), call("mint.unsqueeze", weight, 2), bias,
               stride=(1, one(stride)), dilation=(1, one(dilation)), groups=groups, **extra)
    return call("mint.squeeze", out, 2)
