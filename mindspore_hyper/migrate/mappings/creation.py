"""Tensor creation: arange, zeros/ones/full (and *_like, new_*), eye, tril/triu.

The dtype is always written out, taken from the value torch produced on the example inputs
(torch and MindSpore infer different defaults, e.g. torch.full with an int fill gives int64).
Device arguments are dropped: MindSpore places tensors by context.
"""
import torch

from mindspore_hyper.migrate.mappings.common import call, literal, ms_dtype, sizes
from mindspore_hyper.migrate.mappings.registry import Unsupported, function, method

aten = torch.ops.aten


def _result_dtype(dtype, result) -> str:
    """The dtype argument, else the dtype torch gave the result (`result`: the call's own value)."""
    value = dtype.value
    if value is None:
        value = result.dtype
    if value is None:
        raise Unsupported("the result dtype is unknown (no example value was recorded)")
    return ms_dtype(value)


@function("ops.arange", torch.arange, aten.arange)
def arange(start=0, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False, *,
           result):
    if end.value is None:
        start, end = None, start
    args = [end] if start is None else [start, end] + ([step] if step.value != 1 else [])
    return call("ops.arange", *args, dtype=_result_dtype(dtype, result))


def _filled(fn: str):
    def emit(*size, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False,
             result):
        return call(fn, sizes(size), dtype=_result_dtype(dtype, result))
    return emit


def _filled_aten(fn: str):
    """aten.zeros/ones: the size comes as one list argument named `size`."""
    def emit(size, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False, *, result):
        return call(fn, size if size.items is not None else sizes([size]), dtype=_result_dtype(dtype, result))
    return emit


function("mint.zeros", torch.zeros)(_filled("mint.zeros"))
function("mint.ones", torch.ones)(_filled("mint.ones"))
function("mint.zeros", aten.zeros)(_filled_aten("mint.zeros"))
function("mint.ones", aten.ones)(_filled_aten("mint.ones"))


@function("ops.full", torch.full, aten.full)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False, *,
         result):
    return call("ops.full", sizes([size]), fill_value, dtype=_result_dtype(dtype, result))


def _like(fn: str):
    def emit(self, fill_value=None, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False,
             memory_format=None, *, result):
        fill = [fill_value] if fill_value.value is not None or not fill_value.is_constant else []
        return call(fn, self, *fill, dtype=_result_dtype(dtype, result))
    return emit


function("ops.zeros_like", aten.zeros_like, torch.zeros_like)(_like("ops.zeros_like"))
function("ops.ones_like", aten.ones_like, torch.ones_like)(_like("ops.ones_like"))
function("ops.full_like", aten.full_like, torch.full_like)(_like("ops.full_like"))


@function("ops.full_like", aten.fill)
def fill(self, value, *, result):
    """`t.fill_(v)` made out of place by the in-place pass: a tensor of t's shape and dtype, every element v
    (FSMT's causal mask: `torch.zeros(n, n).float().fill_(min)`)."""
    if value.is_tensor:
        raise Unsupported("fill with a tensor value (only a number is supported)")
    return call("ops.full_like", self, value, dtype=_result_dtype(literal(None), result))


# uninitialised: torch leaves the values unspecified and a correct program writes them before reading them, so
# zeros are one choice of them (PhiMoE's router; the in-place pass turns the writes into out-of-place ops)
function("ops.zeros_like (torch: uninitialised)", aten.empty_like, torch.empty_like)(_like("ops.zeros_like"))


def _new(fn: str):
    def emit(self, *size_and_fill, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False,
             size=None, fill_value=None, result):
        if size.value is not None:
            shape, fill = size, [fill_value] if fill_value.value is not None else []
        elif fn == "ops.full":
            shape, fill = sizes(size_and_fill[:-1]), [size_and_fill[-1]]
        else:
            shape, fill = sizes(size_and_fill), []
        return call(fn, sizes([shape]) if shape.items is None else shape, *fill,
                    dtype=_result_dtype(dtype, result))
    return emit


function("mint.ones", aten.new_ones, method("new_ones"))(_new("mint.ones"))
function("mint.zeros", aten.new_zeros, method("new_zeros"))(_new("mint.zeros"))
function("ops.full", aten.new_full, method("new_full"))(_new("ops.full"))
# an uninitialised tensor: torch leaves its values unspecified, zeros are one choice of them (programs write it
# before reading it: the in-place pass turns those writes into scatters)
function("mint.zeros (torch: uninitialised)", aten.new_empty, method("new_empty"))(_new("mint.zeros"))


@function("mint.eye", aten.eye, torch.eye)
def eye(n, m=None, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False, *, result):
    # the identity matrix (Gated DeltaNet's forward substitution under export adds it: `ut + torch.eye(chunk)`)
    return call("mint.eye", *([n] if m.value is None else [n, m]), dtype=_result_dtype(dtype, result))


@function("ops.tril", aten.tril, torch.tril, method("tril"))
def tril(self, diagonal=0):
    # mint.tril has no CPU kernel.
    return call("ops.tril", self, diagonal)


@function("mint.triu", aten.triu, torch.triu, method("triu"))
def triu(self, diagonal=0):
    return call("mint.triu", self, diagonal)


@function("ops.full (a 0-d tensor)", aten.scalar_tensor)
def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False, *, result):
    return call("ops.full", "()", s, dtype=_result_dtype(dtype, result))
