"""Elementwise ops with broadcasting: activations, arithmetic, comparisons, casts, dropout.

The output follows the most-sharded full-size input; other inputs are laid out to match
(broadcast dimensions unsharded). Partial(sum) survives linear ops: Add/Sub (replicated
operands, Python numbers included, become Partial by zeroing on all but one device), Mul/Div by
a non-partial operand, Neg and Cast. Every other op reduces Partial inputs first.
"""
from __future__ import annotations

import math
from typing import List

from mindspore_hyper.dtensor.rules.common import make, without_partial
from mindspore_hyper.dtensor.rules.registry import Decision, accepts_uneven, register

ADDITIVE = ("Add", "AddExt", "Sub", "SubExt", "AddScalar", "SubScalar", "AddN")
SCALING = ("Mul", "Muls", "Div", "Divs", "RealDiv", "Neg", "Cast", "ToDtype", "StopGradient")
DIVISIONS = ("Div", "Divs", "RealDiv")
VALUE_FREE = ("OnesLike", "ZerosLike")
GENERAL = (
    # activations and unary math
    "ReLU", "ReLU6", "GeLU", "FastGeLU", "SiLU", "Tanh", "Sigmoid", "Erf", "Erfc", "Erfinv", "Exp", "Log", "Sqrt",
    "Rsqrt", "Abs", "Square", "Reciprocal", "Sin", "Cos", "Tan", "Sinh", "Cosh", "Asin", "ACos", "Atan", "Asinh",
    "Atanh", "Softplus", "SoftplusExt", "LeakyReLUExt", "Elu", "SeLU", "CeLU", "Softsign", "SoftShrink", "HShrink",
    "Sign", "Floor", "Ceil", "Round", "Trunc", "Sinc", "Lgamma", "Digamma", "IsFinite", "IsNan", "IsInf",
    "NanToNum", "Log1p", "Expm1", "Mish", "HSwish", "HSigmoid", "LogicalNot",
    # binary and ternary arithmetic
    "Pow", "PowTensorScalar", "PowScalarTensor", "Maximum", "Minimum", "Fmax", "Atan2", "Hypot", "Xlogy",
    "FloorDiv", "Mod", "FloorMod", "RemainderTensorTensor", "DivMod", "Gcd", "Heaviside", "Lerp", "Addcmul",
    "Addcdiv", "ClampScalar", "ClampTensor",
    # comparisons, logic and bits
    "Equal", "NotEqual", "Less", "LessScalar", "LessEqual", "Greater", "GreaterEqual", "IsClose", "LogicalAnd",
    "LogicalOr", "LogicalXor", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseAndTensor", "BitwiseOrTensor",
    "BitwiseXorTensor",
    # selection and writes of whole values
    "MaskedFill", "Select", "Where", "Assign",
    # random: the dispatcher draws them for the global shape first (dtensor/random.py); the rule gives the layout
    "Dropout", "DropoutExt", "Bernoulli",
)


def _broadcast_shape(shapes) -> tuple:
    """The broadcast of the operands' global shapes.

    Raises:
        ValueError: shapes that do not broadcast (as MindSpore refuses them on one device; run per
            shard, equal local shapes would hide it).
    """
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(ndim):
        sizes = [s[i - ndim + len(s)] for s in shapes if i - ndim + len(s) >= 0]
        if len(set(sizes) - {1}) > 1:
            raise ValueError(f"global shapes {[tuple(s) for s in shapes]} do not broadcast (dimension {i - ndim}: "
                             f"sizes {sorted(set(sizes))}); a plain tensor beside a DTensor is a global value, not one "
                             "device's shard: make it a DTensor with DTensor.from_local")
        out.append(max(sizes))
    return tuple(out)


def elementwise_decision(call, keep_partial: str) -> Decision:
    """keep_partial: 'add', 'scale', 'drop' (output ignores values) or 'none'."""
    tensors = call.tensors
    mesh = tensors[0].layout.mesh
    out_shape = _broadcast_shape([t.shape for t in tensors])
    ndim = len(out_shape)
    full = [t for t in tensors if tuple(t.shape) == out_shape]
    lead = max(full or tensors, key=lambda t: (len(t.layout.sharded_axes()), math.prod(t.shape)))
    offset = ndim - lead.ndim
    out_dims = [()] * ndim
    for d, entry in enumerate(lead.layout.dims):
        if lead.shape[d] == out_shape[d + offset]:
            out_dims[d + offset] = entry

    partial = {}
    partial_ops = {op for t in tensors for op in t.layout.partial.values()}
    if keep_partial == "add" and partial_ops == {"sum"}:
        partial = {a: "sum" for t in tensors for a in t.layout.partial}
    elif keep_partial == "scale" and partial_ops == {"sum"}:
        partial_inputs = [i for i, t in enumerate(tensors) if t.layout.is_partial]
        divisor = call.inputs[1] if len(call.inputs) > 1 else None  # by position: 1.0 / x has one tensor
        divisor_partial = call.name in DIVISIONS and getattr(getattr(divisor, "layout", None), "is_partial", False)
        if len(partial_inputs) == 1 and not divisor_partial:
            partial = dict(tensors[partial_inputs[0]].layout.partial)
    used = {a for e in out_dims for a in e}
    if used & set(partial):
        partial = {}

    inputs: List = []
    for t in tensors:
        off = ndim - t.ndim
        dims = [out_dims[d + off] if t.shape[d] == out_shape[d + off] else () for d in range(t.ndim)]
        if keep_partial == "add":
            in_partial = partial  # replicated operands become Partial(sum): zero on all but one device
        elif keep_partial == "scale":
            in_partial = {a: op for a, op in t.layout.partial.items() if a in partial}
        elif keep_partial == "drop":
            in_partial = t.layout.partial
        else:
            in_partial = {}
        inputs.append(make(mesh, dims, in_partial))
    out = make(mesh, out_dims, partial if keep_partial != "drop" else {})
    numbers = any(_is_number(v) for v in call.inputs[:2])
    local_args = _numbers_added_once(partial) if keep_partial == "add" and partial and numbers else None
    return Decision(inputs=inputs, outputs=out, local_args=local_args)


def _numbers_added_once(partial):
    """A Python-number operand of a Partial(sum) addition is kept on coordinate 0 of the Partial
    axes and zeroed elsewhere, so the reduction adds it once."""
    def local_args(local_inputs, coords):
        first = all(coords[a] == 0 for a in partial)
        return [type(v)(0) if i < 2 and _is_number(v) and not first else v for i, v in enumerate(local_inputs)]
    return local_args


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@accepts_uneven()
@register(*ADDITIVE)
def additive(call):
    return elementwise_decision(call, "add")


@accepts_uneven()
@register(*SCALING)
def scaling(call):
    return elementwise_decision(call, "scale")


@accepts_uneven()
@register(*VALUE_FREE)
def value_free(call):
    return elementwise_decision(call, "drop")


@accepts_uneven()
@register(*GENERAL)
def general(call):
    return elementwise_decision(call, "none")


@accepts_uneven()
@register("PReLU")
def prelu(call):
    """Elementwise with one slope per channel (dimension 1): the slopes follow the channel split."""
    x, slope = call.tensors[0], call.tensors[1]
    layout = without_partial(x.layout)
    per_channel = x.ndim > 1 and slope.ndim == 1 and slope.shape[0] == x.shape[1] and slope.shape[0] > 1
    slope_layout = make(layout.mesh, [layout.dims[1] if per_channel else ()] * slope.ndim)
    return Decision(inputs=[layout, slope_layout], outputs=layout)
