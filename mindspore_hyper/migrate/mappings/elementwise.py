"""Elementwise arithmetic, comparisons and logic on tensors, and on Python numbers (shape arithmetic).

A call whose operands are all Python numbers (fx traces `x.shape[1] // heads`) stays a Python
expression; a call with a tensor becomes the mint function (functional calls, so a simulated
DTensor on either side reaches its dispatcher).
"""
import math
import operator

import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call, expect, is_python
from mindspore_hyper.migrate.mappings.registry import Unsupported, function, method

aten = torch.ops.aten


def _binary(ms_fn: str, py_op: str):
    def emit(self, other, alpha=None):
        if is_python(self, other):
            return f"({self} {py_op} {other})"
        if alpha.value not in (None, 1):
            return call(ms_fn, self, other, alpha=alpha)
        return call(ms_fn, self, other)
    return emit


function("mint.add", aten.add, torch.add, method("add"), operator.add)(_binary("mint.add", "+"))
function("mint.sub", aten.sub, aten.subtract, torch.sub, torch.subtract, method("sub"), operator.sub)(_binary("mint.sub", "-"))
function("mint.mul", aten.mul, aten.multiply, torch.mul, torch.multiply, method("mul"), operator.mul)(_binary("mint.mul", "*"))


@function("mint.pow", aten.pow, torch.pow, method("pow"), operator.pow)
def pow_(self, exponent):
    if is_python(self, exponent):
        return f"({self} ** {exponent})"
    return call("mint.pow", self, exponent)


function("mint.remainder", aten.remainder, torch.remainder, method("remainder"), operator.mod)(
    _binary("mint.remainder", "%"))
function("mint.minimum", aten.minimum, torch.minimum)(_binary("mint.minimum", "min"))
function("mint.maximum", aten.maximum, torch.maximum)(_binary("mint.maximum", "max"))


@function("mint.sub", aten.rsub, torch.rsub)
def rsub(self, other, alpha=1):
    expect(alpha, (1,), "alpha")
    return call("mint.sub", other, self)


@function("mint.div", aten.div, aten.true_divide, torch.div, torch.true_divide, method("div"), operator.truediv)
def div(self, other, rounding_mode=None):
    mode = rounding_mode.value
    if is_python(self, other):
        if mode == "trunc":  # Python's // floors: the magnitudes' quotient with the sign of the true quotient
            return f"((abs({self}) // abs({other})) * (1 if ({self} < 0) == ({other} < 0) else -1))"
        return f"({self} {'//' if mode == 'floor' else '/'} {other})"
    if mode is None:
        return call("mint.div", self, other)
    if mode == "floor":
        return call("ops.floor_divide", self, other)
    if mode == "trunc":
        return _trunc_divide(self, other)
    raise Unsupported(f"div(rounding_mode={mode!r}) is not mapped (MindSpore 2.10 has no CPU Trunc kernel)")


def _trunc_divide(self, other) -> str:
    """`div(self, other, rounding_mode="trunc")` without MindSpore's Trunc (no CPU kernel): for integers the
    quotient of the magnitudes, floored, negated where the operands' signs differ (exact); for floats the true
    quotient's magnitude floored, with its sign (torch computes trunc(a / b): the same rounded quotient)."""
    def integer(arg) -> bool:
        return arg.is_tensor and not arg.dtype.is_floating_point and not arg.dtype.is_complex

    if integer(self) and not other.is_tensor and not other.is_constant:
        raise Unsupported("div(rounding_mode='trunc') of an integer tensor by a run-time Python number is not mapped")
    if not (integer(self) and (integer(other) or isinstance(other.value, int))):
        return f"(lambda q: mint.mul(mint.floor(mint.abs(q)), mint.sign(q)))({call('mint.div', self, other)})"
    if other.is_tensor:
        negative = call("mint.logical_xor", call("mint.lt", self, 0), call("mint.lt", other, 0))
        magnitude = call("ops.floor_divide", call("mint.abs", self), call("mint.abs", other))
    elif other.value == 0:
        raise Unsupported("div(rounding_mode='trunc') by the integer 0")
    else:
        negative = call("mint.lt" if other.value > 0 else "mint.gt", self, 0)
        magnitude = call("ops.floor_divide", call("mint.abs", self), abs(other.value))
    return f"(lambda q: mint.where({negative}, mint.neg(q), q))({magnitude})"


@function("ops.floor_divide", aten.floor_divide, torch.floor_divide, method("floor_divide"), operator.floordiv)
def floor_divide(self, other):
    if is_python(self, other):
        return f"({self} // {other})"
    return call("ops.floor_divide", self, other)


def _unary(ms_fn: str, py_op: str = ""):
    def emit(self):
        if py_op and is_python(self):
            return f"({py_op}{self})"
        return call(ms_fn, self)
    return emit


function("mint.neg", aten.neg, torch.neg, method("neg"), operator.neg)(_unary("mint.neg", "-"))
for _name, _keys in {
    "abs": (aten.abs, torch.abs, method("abs")), "exp": (aten.exp, torch.exp, method("exp")),
    "sqrt": (aten.sqrt, torch.sqrt, method("sqrt")),
    "rsqrt": (aten.rsqrt, torch.rsqrt, method("rsqrt")), "erf": (aten.erf, torch.erf, method("erf")),
    "sin": (aten.sin, torch.sin, method("sin")), "cos": (aten.cos, torch.cos, method("cos")),
    "reciprocal": (aten.reciprocal, torch.reciprocal, method("reciprocal")),
    "logical_not": (aten.logical_not, torch.logical_not, method("logical_not")),
    "expm1": (aten.expm1, torch.expm1, method("expm1")),
    "floor": (aten.floor, torch.floor, method("floor")), "ceil": (aten.ceil, torch.ceil, method("ceil")),
    "sign": (aten.sign, torch.sign, method("sign")), "tan": (aten.tan, torch.tan, method("tan")),
}.items():
    function(f"mint.{_name}", *_keys)(_unary(f"mint.{_name}"))


@function("helper exact_log1p (mint.log of 1 + x, a series near 0, in float64)", aten.log1p, torch.log1p,
          method("log1p"))
def log1p(self):
    # MindSpore's CPU log1p is log(1 + x): 0 for |x| < 6e-8 in float32 (generated_support.exact_log1p)
    return call("exact_log1p", self)


@function("ops.acos", aten.acos, torch.acos, method("acos"))
def acos(self):
    # YOSO's collision probability 1 - acos(q.k) / pi; mint.acos has no CPU kernel (AcosExt)
    return call("ops.acos", self)


@function("mint.log", aten.log, torch.log, method("log"))
def log(self):
    """float32 log computed in float64 and rounded back: MindSpore 2.10's vectorised CPU float32
    log is an ulp off torch's for most inputs (log(2) / log(16) * 8 gives 1.9999995, not 2), which
    moves integers truncated from it (T5's relative-position buckets at distances >= 16)."""
    if self.is_tensor and self.dtype == torch.float32:
        return f"mint.log({self}.astype(ms.float64)).astype(ms.float32)"
    return call("mint.log", self)


@function("math.sqrt", math.sqrt)
def python_sqrt(x):
    if not is_python(x):
        raise Unsupported("math.sqrt of a tensor; use torch.sqrt")
    return call("math.sqrt", x)


@function("float (a symbolic size as a Python float)", torch.sym_float)
def sym_float(x):
    if not is_python(x):
        raise Unsupported("torch.sym_float of a tensor")
    return call("float", x)


def _symbolic_extreme(fn: str):
    def emit(a, b):
        if not is_python(a, b):
            raise Unsupported(f"torch.sym_{fn} of a tensor")
        return call(fn, a, b)
    return emit


function("min (of symbolic sizes)", torch.sym_min)(_symbolic_extreme("min"))
function("max (of symbolic sizes)", torch.sym_max)(_symbolic_extreme("max"))


@function("mint.clamp", aten.clamp, aten.clip, torch.clamp, method("clamp"), torch.clip, method("clip"))
def clamp(self, min=None, max=None):
    return call("mint.clamp", self, min=min, max=max)


@function("mint.clamp", aten.hardtanh, F.hardtanh)
def hardtanh(self, min_val=-1.0, max_val=1.0, inplace=False):
    # mint's Hardtanh has no CPU kernel; clamp is the same function (its gradient is 0 outside, as torch's)
    return call("mint.clamp", self, min=min_val, max=max_val)


@function("mint.clamp", aten.clamp_min, method("clamp_min"))
def clamp_min(self, min):
    return call("mint.clamp", self, min=min)


@function("mint.clamp", aten.clamp_max, method("clamp_max"))
def clamp_max(self, max):
    return call("mint.clamp", self, max=max)


_COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
for _name, _op in _COMPARISONS.items():
    function(f"mint.{_name}", getattr(aten, _name), getattr(torch, _name), method(_name), getattr(operator, _name))(
        _binary(f"mint.{_name}", _op))


def _is_bool(*args) -> bool:
    return all(a.dtype == torch.bool for a in args if a.is_tensor)


@function("mint.logical_and", aten.logical_and, torch.logical_and, method("logical_and"))
def logical_and(self, other):
    return call("mint.logical_and", self, other)


@function("mint.logical_or", aten.logical_or, torch.logical_or, method("logical_or"))
def logical_or(self, other):
    return call("mint.logical_or", self, other)


def _int_operands(self, other):
    """Both operands as tensors (MindSpore 2.10 has no CPU kernel for bitwise ops with a Python scalar)."""
    tensor = self if self.is_tensor else other
    return [a if a.is_tensor else f"Tensor({a}, {tensor}.dtype)" for a in (self, other)]


@function("mint.logical_and / ops.bitwise_and", aten.bitwise_and, aten.__and__, torch.bitwise_and, operator.and_,
          method("bitwise_and"))
def bitwise_and(self, other):
    if is_python(self, other):
        return f"({self} & {other})"
    if _is_bool(self, other):
        return call("mint.logical_and", self, other)
    return call("ops.bitwise_and", *_int_operands(self, other))


@function("mint.logical_or / ops.bitwise_or", aten.bitwise_or, aten.__or__, torch.bitwise_or, operator.or_,
          method("bitwise_or"))
def bitwise_or(self, other):
    if is_python(self, other):
        return f"({self} | {other})"
    if _is_bool(self, other):
        return call("mint.logical_or", self, other)  # mint.bitwise_or has no CPU kernel
    return call("ops.bitwise_or", *_int_operands(self, other))


@function("mint.logical_not / ops.invert", aten.bitwise_not, torch.bitwise_not, operator.invert, method("bitwise_not"))
def bitwise_not(self):
    if is_python(self):
        return f"(~{self})"
    return call("mint.logical_not" if _is_bool(self) else "ops.invert", self)
