"""The ops the coverage sweep runs on DTensors (`mindspore_hyper.tools.coverage.op_sweep`).

Each `OpCase` is a call of a MindSpore functional op, `mint` op, Tensor method or operator on
small random inputs that runs on CPU. `reference` replaces `fn` on one device where the two
differ on purpose (in-place ops: MindSpore 2.10 on CPU leaves plain tensors unchanged by
`add_` and friends; a DTensor follows the documented in-place semantics). `check` compares
random ops by properties instead of values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, nn, ops

__all__ = ["Arg", "OpCase", "CATALOG"]


@dataclass(frozen=True)
class Arg:
    """A tensor input: its shape and how its values are drawn: "float" (standard normal),
    "positive" (0.5..2), "unit" (-0.9..0.9), "prob" (0.05..0.95), "int" (-8..8), "bool",
    "index<n>" (0..n-1), "distinct<n>" (0..n-1, no repeats along dimension 0: scatters without
    colliding writes, whose winner MindSpore leaves unspecified), "sorted" (ascending along the
    last dimension)."""

    shape: Tuple[int, ...]
    kind: str = "float"


@dataclass(frozen=True)
class OpCase:
    """One op call of the sweep (see module docstring)."""

    name: str
    fn: Callable
    args: Tuple[Arg, ...]
    reference: Optional[Callable] = None
    check: Optional[Callable[[np.ndarray, np.ndarray], str]] = None
    partial: bool = True
    note: str = ""


def _args(specs) -> Tuple[Arg, ...]:
    return tuple(s if isinstance(s, Arg) else Arg(s) for s in specs)


def case(name: str, fn: Callable, *specs, **options) -> OpCase:
    return OpCase(name, fn, _args(specs), **options)


X = (4, 6)          # the default 2-D input
X3 = (4, 2, 6)      # the default 3-D input


def positive(shape=X) -> Arg:
    return Arg(shape, "positive")


def unit(shape=X) -> Arg:
    return Arg(shape, "unit")


def prob(shape=X) -> Arg:
    return Arg(shape, "prob")


def ints(shape=X) -> Arg:
    return Arg(shape, "int")


def bools(shape=X) -> Arg:
    return Arg(shape, "bool")


def index(n: int, shape) -> Arg:
    return Arg(shape, f"index{n}")


# -- random ops: compared by properties ------------------------------------------------------------

def _kept_or_dropped(p: float):
    """Dropout of ones: every element is 0 or 1/(1-p), and some of each appear."""
    def check(reference: np.ndarray, got: np.ndarray) -> str:
        scaled = 1.0 / (1.0 - p)
        valid = np.isclose(got, 0.0) | np.isclose(got, scaled)
        if not valid.all():
            return f"values other than 0 and {scaled:.3g}"
        if np.isclose(got, 0.0).all() or np.isclose(got, scaled).all():
            return "all elements dropped or all kept"
        return ""
    return check


def _uniform_check(reference: np.ndarray, got: np.ndarray) -> str:
    if got.min() < 0 or got.max() >= 1:
        return "values outside [0, 1)"
    return "" if len(np.unique(got)) > got.size // 2 else "values repeat"


def _normal_check(reference: np.ndarray, got: np.ndarray) -> str:
    return "" if len(np.unique(got)) > got.size // 2 else "values repeat"


def _inplace(method: str):
    """`x.<method>(*rest)` on a DTensor, returning (result, x) so the written target is compared."""
    def fn(x, *rest):
        out = getattr(x, method)(*rest)
        return out, x
    return fn


def _out_of_place(fn):
    def reference(x, *rest):
        out = fn(x, *rest)
        return out, out
    return reference


def _ones(x):
    return ops.ones_like(x)


CATALOG: Tuple[OpCase, ...] = (
    # -- unary elementwise (ops) --------------------------------------------------------------
    case("ops.abs", ops.abs, X),
    case("ops.neg", ops.neg, X),
    case("ops.exp", ops.exp, X),
    case("ops.expm1", ops.expm1, X),
    case("ops.exp2", ops.exp2, X),
    case("ops.log", ops.log, positive()),
    case("ops.log2", ops.log2, positive()),
    case("ops.log10", ops.log10, positive()),
    case("ops.log1p", ops.log1p, positive()),
    case("ops.sqrt", ops.sqrt, positive()),
    case("ops.rsqrt", ops.rsqrt, positive()),
    case("ops.square", ops.square, X),
    case("ops.reciprocal", ops.reciprocal, positive()),
    case("ops.sin", ops.sin, X),
    case("ops.cos", ops.cos, X),
    case("ops.tan", ops.tan, unit()),
    case("ops.sinh", ops.sinh, X),
    case("ops.cosh", ops.cosh, X),
    case("ops.tanh", ops.tanh, X),
    case("ops.asin", ops.asin, unit()),
    case("ops.acos", ops.acos, unit()),
    case("ops.atan", ops.atan, X),
    case("ops.asinh", ops.asinh, X),
    case("ops.atanh", ops.atanh, unit()),
    case("ops.sigmoid", ops.sigmoid, X),
    case("ops.erf", ops.erf, X),
    case("ops.erfc", ops.erfc, X),
    case("ops.erfinv", ops.erfinv, unit()),
    case("ops.floor", ops.floor, X),
    case("ops.ceil", ops.ceil, X),
    case("ops.round", ops.round, X),
    case("ops.trunc", ops.trunc, X),
    case("ops.frac", ops.frac, X),
    case("ops.sign", ops.sign, X),
    case("ops.deg2rad", ops.deg2rad, X),
    case("ops.rad2deg", ops.rad2deg, X),
    case("ops.sinc", ops.sinc, X),
    case("ops.lgamma", ops.lgamma, positive()),
    case("ops.digamma", ops.digamma, positive()),
    case("ops.isnan", ops.isnan, X),
    case("ops.isinf", ops.isinf, X),
    case("ops.isfinite", ops.isfinite, X),
    case("ops.nan_to_num", lambda x: ops.nan_to_num(ops.log(x)), X, note="log of negatives gives NaN first"),
    case("ops.relu", ops.relu, X),
    case("ops.relu6", ops.relu6, X),
    case("ops.gelu", ops.gelu, X),
    case("ops.gelu(tanh)", lambda x: ops.gelu(x, approximate="tanh"), X),
    case("ops.silu", ops.silu, X),
    case("ops.elu", ops.elu, X),
    case("ops.selu", ops.selu, X),
    case("ops.celu", ops.celu, X),
    case("ops.softplus", ops.softplus, X),
    case("ops.softsign", ops.softsign, X),
    case("ops.hardswish", ops.hardswish, X),
    case("ops.hardsigmoid", ops.hardsigmoid, X),
    case("ops.hardtanh", ops.hardtanh, X),
    case("ops.mish", ops.mish, X),
    case("ops.leaky_relu", lambda x: ops.leaky_relu(x, 0.1), X),
    case("ops.logsigmoid", ops.logsigmoid, X),
    case("ops.tanhshrink", ops.tanhshrink, X),
    case("ops.softshrink", ops.softshrink, X),
    case("ops.hardshrink", ops.hardshrink, X),
    case("ops.logical_not", ops.logical_not, bools()),
    case("~x (int: logical not in MindSpore)", lambda x: ~x, ints()),
    # -- unary elementwise (mint) -------------------------------------------------------------
    case("mint.exp", mint.exp, X),
    case("mint.log", mint.log, positive()),
    case("mint.sqrt", mint.sqrt, positive()),
    case("mint.rsqrt", mint.rsqrt, positive()),
    case("mint.abs", mint.abs, X),
    case("mint.neg", mint.neg, X),
    case("mint.sin", mint.sin, X),
    case("mint.cos", mint.cos, X),
    case("mint.tanh", mint.tanh, X),
    case("mint.sigmoid", mint.sigmoid, X),
    case("mint.erf", mint.erf, X),
    case("mint.floor", mint.floor, X),
    case("mint.reciprocal", mint.reciprocal, positive()),
    case("mint.nn.functional.relu", mint.nn.functional.relu, X),
    case("mint.nn.functional.silu", mint.nn.functional.silu, X),
    case("mint.nn.functional.softplus", mint.nn.functional.softplus, X),
    # -- binary elementwise ---------------------------------------------------------------------
    case("ops.add", ops.add, X, X),
    case("ops.add (broadcast row)", ops.add, X, (6,)),
    case("ops.add (outer broadcast)", ops.add, (4, 1), (1, 6)),
    case("ops.sub", ops.sub, X, X),
    case("ops.mul", ops.mul, X, X),
    case("ops.mul (broadcast column)", ops.mul, X, (4, 1)),
    case("ops.div", ops.div, X, positive()),
    case("ops.floor_divide", ops.floor_divide, X, positive()),
    case("ops.remainder", ops.remainder, X, positive()),
    case("ops.fmod", ops.fmod, X, positive()),
    case("ops.pow", ops.pow, positive(), X),
    case("ops.maximum", ops.maximum, X, X),
    case("ops.minimum", ops.minimum, X, X),
    case("ops.fmax", ops.fmax, X, X),
    case("ops.atan2", ops.atan2, X, X),
    case("ops.hypot", ops.hypot, X, X),
    case("ops.logaddexp", ops.logaddexp, X, X),
    case("ops.logaddexp2", ops.logaddexp2, X, X),
    case("ops.xlogy", ops.xlogy, X, positive()),
    case("ops.copysign", ops.copysign, X, X),
    case("ops.equal", ops.equal, ints(), ints()),
    case("ops.ne", ops.ne, ints(), ints()),
    case("ops.lt", ops.lt, X, X),
    case("ops.le", ops.le, X, X),
    case("ops.gt", ops.gt, X, X),
    case("ops.ge", ops.ge, X, X),
    case("ops.isclose", ops.isclose, X, X),
    case("ops.logical_and", ops.logical_and, bools(), bools()),
    case("ops.logical_or", ops.logical_or, bools(), bools()),
    case("ops.logical_xor", ops.logical_xor, bools(), bools()),
    case("ops.bitwise_and", ops.bitwise_and, ints(), ints()),
    case("ops.bitwise_or", ops.bitwise_or, ints(), ints()),
    case("ops.bitwise_xor", ops.bitwise_xor, ints(), ints()),
    case("ops.gcd", ops.gcd, ints(), ints()),
    case("ops.heaviside", ops.heaviside, X, X),
    case("ops.lerp", lambda x, y: ops.lerp(x, y, 0.3), X, X),
    case("ops.lerp (tensor weight)", ops.lerp, X, X, prob()),
    case("ops.addcmul", lambda x, y, z: ops.addcmul(x, y, z, 0.5), X, X, X),
    case("ops.addcdiv", lambda x, y, z: ops.addcdiv(x, y, z, 0.5), X, X, positive()),
    case("ops.where", ops.where, bools(), X, X),
    case("ops.masked_fill", lambda x, m: ops.masked_fill(x, m, 0.5), X, bools()),
    case("ops.clamp (numbers)", lambda x: ops.clamp(x, -0.5, 0.5), X),
    case("ops.clamp (tensors)", ops.clamp, X, unit(), positive()),
    case("ops.clamp (keyword tensors)", lambda x, lo, hi: ops.clamp(x, min=lo, max=hi), X, unit(), positive()),
    case("Tensor.add (keyword other)", lambda x, y: x.add(other=y), X, X),
    case("Tensor.clamp (keyword tensors)", lambda x, lo, hi: x.clamp(min=lo, max=hi), X, unit(), positive()),
    case("Tensor.masked_fill (keywords)", lambda x, m: x.masked_fill(mask=m, value=0.5), X, bools()),
    case("Tensor.lerp (keyword tensors)", lambda x, y, w: x.lerp(end=y, weight=w), X, X, prob()),
    case("mint.add (alpha)", lambda x, y: mint.add(x, y, alpha=2.0), X, X),
    case("mint.sub", mint.sub, X, X),
    case("mint.mul", mint.mul, X, X),
    case("mint.div", mint.div, X, positive()),
    case("mint.maximum", mint.maximum, X, X),
    case("mint.eq", mint.eq, ints(), ints()),
    case("mint.where", mint.where, bools(), X, X),
    case("mint.clamp", lambda x: mint.clamp(x, -0.5, 0.5), X),
    # -- Python operators, numbers and plain tensors on either side -------------------------------
    case("x + 2.0", lambda x: x + 2.0, X),
    case("2.0 - x", lambda x: 2.0 - x, X),
    case("x * 3", lambda x: x * 3, X),
    case("1.0 / x", lambda x: 1.0 / x, positive()),
    case("x ** 2", lambda x: x ** 2, X),
    case("2.0 ** x", lambda x: 2.0 ** x, X),
    case("x // y", lambda x, y: x // y, X, positive()),
    case("x % y", lambda x, y: x % y, X, positive()),
    case("x @ y", lambda x, y: x @ y, X, (6, 4)),
    case("x < y", lambda x, y: x < y, X, X),
    case("x >= y", lambda x, y: x >= y, X, X),
    case("x == y", lambda x, y: x == y, ints(), ints()),
    case("x != y", lambda x, y: x != y, ints(), ints()),
    case("x & y (bool)", lambda x, y: x & y, bools(), bools()),
    case("x | y (int)", lambda x, y: x | y, ints(), ints()),
    case("x ^ y (bool)", lambda x, y: x ^ y, bools(), bools()),
    case("-x", lambda x: -x, X),
    case("abs(x)", abs, X),
    # -- reductions ---------------------------------------------------------------------------
    case("ops.sum", ops.sum, X3),
    case("ops.sum(dim)", lambda x: ops.sum(x, 1), X3),
    case("ops.sum(dims, keepdim)", lambda x: ops.sum(x, (0, 2), keepdim=True), X3),
    case("ops.mean", ops.mean, X3),
    case("ops.mean(dim)", lambda x: ops.mean(x, -1), X3),
    case("ops.prod(dim)", lambda x: ops.prod(x, 1), X),
    case("ops.amax", lambda x: ops.amax(x, 0), X),
    case("ops.amin", lambda x: ops.amin(x, (0, 1)), X),
    case("ops.max(dim)", lambda x: ops.max(x, 1), X),
    case("ops.min(dim)", lambda x: ops.min(x, 0, keepdims=True), X),
    case("ops.argmax", lambda x: ops.argmax(x, 1), X),
    case("ops.argmin", lambda x: ops.argmin(x, 0), X),
    case("ops.std", lambda x: ops.std(x, 1), X),
    case("ops.var", lambda x: ops.var(x, 0), X),
    case("ops.std_mean", lambda x: ops.std_mean(x, 1), X),
    case("ops.logsumexp", lambda x: ops.logsumexp(x, 1), X),
    case("ops.norm", ops.norm, X),
    case("ops.norm(dim)", lambda x: ops.norm(x, 2, 1), X),
    case("ops.all", lambda x: ops.all(x, 1), bools()),
    case("ops.any", ops.any, bools()),
    case("ops.count_nonzero", lambda x: ops.count_nonzero(x, 1), ints()),
    case("ops.median", lambda x: ops.median(x, 1), X),
    case("ops.nansum", lambda x: ops.nansum(x, 0), X),
    case("ops.cumsum", lambda x: ops.cumsum(x, 1), X),
    case("ops.cumprod", lambda x: ops.cumprod(x, 0), X),
    case("ops.cummax", lambda x: ops.cummax(x, 1), X),
    case("ops.cummin", lambda x: ops.cummin(x, 0), X),
    case("ops.logcumsumexp", lambda x: ops.logcumsumexp(x, 1), X),
    case("mint.sum", lambda x: mint.sum(x, 0), X3),
    case("mint.mean", lambda x: mint.mean(x, (1, 2)), X3),
    case("mint.max", mint.max, X),
    case("Tensor.sum()", lambda x: x.sum(), X3),
    case("Tensor.mean(dim)", lambda x: x.mean(1), X3),
    case("Tensor.max()", lambda x: x.max(), X),
    case("Tensor.argmax(dim)", lambda x: x.argmax(0), X),
    # -- shape ---------------------------------------------------------------------------------
    case("ops.reshape", lambda x: ops.reshape(x, (8, 6)), X3),
    case("ops.reshape (merge inner)", lambda x: ops.reshape(x, (4, 12)), X3),
    case("Tensor.view", lambda x: x.view(2, 2, 6), X),
    case("ops.flatten", ops.flatten, X3),
    case("ops.transpose", lambda x: ops.transpose(x, (2, 0, 1)), X3),
    case("ops.permute", lambda x: ops.permute(x, (1, 2, 0)), X3),
    case("ops.swapaxes", lambda x: ops.swapaxes(x, 0, 2), X3),
    case("ops.moveaxis", lambda x: ops.moveaxis(x, 0, -1), X3),
    case("ops.t", ops.t, X),
    case("Tensor.T", lambda x: x.T, X),
    case("ops.squeeze", ops.squeeze, (4, 1, 6)),
    case("ops.unsqueeze", lambda x: ops.unsqueeze(x, 1), X),
    case("ops.expand_dims", lambda x: ops.expand_dims(x, -1), X),
    case("ops.broadcast_to", lambda x: ops.broadcast_to(x, (2, 4, 6)), X),
    case("Tensor.expand_as", lambda x, y: x.expand_as(y), (4, 1), X),
    case("ops.tile", lambda x: ops.tile(x, (2, 1)), X),
    case("ops.repeat_interleave", lambda x: ops.repeat_interleave(x, 2, 1), X),
    case("ops.flip", lambda x: ops.flip(x, (0,)), X),
    case("ops.fliplr", ops.fliplr, X),
    case("ops.rot90", lambda x: ops.rot90(x, 1, (0, 1)), X),
    case("ops.narrow", lambda x: ops.narrow(x, 1, 1, 4), X),
    case("ops.chunk", lambda x: ops.chunk(x, 2, 1), X),
    case("ops.split", lambda x: ops.split(x, [2, 4], 1), X),
    case("ops.tensor_split", lambda x: ops.tensor_split(x, 2, 0), X),
    case("ops.unbind", lambda x: ops.unbind(x, 0), X),
    case("ops.movedim", lambda x: ops.movedim(x, 1, 0), X3),
    case("ops.diagonal", ops.diagonal, (6, 6)),
    case("ops.tril", ops.tril, X),
    case("ops.triu", lambda x: ops.triu(x, 1), X),
    case("ops.ravel", ops.ravel, X),
    case("ops.concat", lambda x, y: ops.concat((x, y), 1), X, X),
    case("ops.cat (dim 0)", lambda x, y: ops.cat([x, y]), X, X),
    case("ops.stack", lambda x, y: ops.stack([x, y], 1), X, X),
    case("ops.hstack", lambda x, y: ops.hstack([x, y]), X, X),
    case("ops.vstack", lambda x, y: ops.vstack([x, y]), X, X),
    case("ops.addn", lambda x, y: ops.addn([x, y]), X, X),
    case("ops.diag", ops.diag, (6,)),
    case("ops.trace", ops.trace, (6, 6)),
    case("ops.outer", ops.outer, (4,), (6,)),
    case("ops.kron", ops.kron, (2, 2), (2, 4)),
    case("mint.cat", lambda x, y: mint.cat([x, y], 1), X, X),
    case("mint.permute", lambda x: mint.permute(x, (2, 1, 0)), X3),
    case("mint.flatten", lambda x: mint.flatten(x, 1), X3),
    case("mint.transpose", lambda x: mint.transpose(x, 0, 1), X3),
    case("Tensor.reshape(-1)", lambda x: x.reshape(-1, 6), X3),
    # -- matrix products ------------------------------------------------------------------------
    case("ops.matmul", ops.matmul, X, (6, 4)),
    case("ops.matmul (batched)", ops.matmul, X3, (4, 6, 2)),
    case("ops.matmul (3-D @ 2-D)", ops.matmul, X3, (6, 4)),
    case("ops.mm", ops.mm, X, (6, 4)),
    case("ops.bmm", ops.bmm, X3, (4, 6, 2)),
    case("ops.baddbmm", ops.baddbmm, (4, 2, 2), X3, (4, 6, 2)),
    case("ops.addmm", ops.addmm, (4, 4), X, (6, 4)),
    case("ops.mv", ops.mv, X, (6,)),
    case("ops.dot", ops.dot, X, (6, 4)),
    case("ops.inner", ops.inner, X, (4, 6)),
    case("ops.tensor_dot", lambda x, y: ops.tensor_dot(x, y, ((1,), (0,))), X, (6, 4)),
    case("ops.dense", ops.dense, X, (8, 6), (8,)),
    case("mint.matmul", mint.matmul, X, (6, 4)),
    case("mint.bmm", mint.bmm, X3, (4, 6, 2)),
    case("mint.nn.functional.linear", mint.nn.functional.linear, X, (8, 6), (8,)),
    # -- neural-network functions ---------------------------------------------------------------
    case("ops.softmax", lambda x: ops.softmax(x, -1), X3),
    case("ops.softmax (dim 0)", lambda x: ops.softmax(x, 0), X),
    case("ops.log_softmax", lambda x: ops.log_softmax(x, 1), X),
    case("ops.softmin", lambda x: ops.softmin(x, 1), X),
    case("mint.softmax", lambda x: mint.softmax(x, -1), X),
    case("nn.LayerNorm", lambda x: nn.LayerNorm((6,))(x), X3),
    case("ops.normalize (L2)", lambda x: ops.L2Normalize(axis=1)(x), X),
    case("ops.glu", lambda x: ops.glu(x, -1), X),
    case("ops.prelu", ops.prelu, (4, 6, 2), (6,)),
    case("ops.conv2d", ops.conv2d, (4, 2, 6, 6), (4, 2, 3, 3)),
    case("ops.conv1d", ops.conv1d, (4, 2, 6), (4, 2, 3)),
    case("nn.Conv2d (pad, bias)", lambda x: _seeded(lambda: nn.Conv2d(2, 4, 3, pad_mode="pad", padding=1,
                                                                       has_bias=True))(x), (4, 2, 6, 6)),
    case("ops.avg_pool2d", lambda x: ops.avg_pool2d(x, 2), (4, 2, 6, 6)),
    case("ops.max_pool2d", lambda x: ops.max_pool2d(x, 2, return_indices=True), (4, 2, 6, 6)),
    case("nn.MaxPool2d", lambda x: nn.MaxPool2d(2, 2)(x), (4, 2, 6, 6)),
    case("ops.adaptive_avg_pool2d", lambda x: ops.adaptive_avg_pool2d(x, 1), (4, 2, 6, 6)),
    case("ops.adaptive_max_pool2d", lambda x: ops.adaptive_max_pool2d(x, 2), (4, 2, 6, 6)),
    case("ops.batch_norm (training)", lambda x, m, v, w, b: (ops.batch_norm(x, m, v, w, b, training=True), m, v),
         (4, 2, 6, 6), (2,), positive((2,)), (2,), (2,), note="also compares the updated moving statistics"),
    case("ops.batch_norm (inference)", lambda x, m, v, w, b: ops.batch_norm(x, m, v, w, b),
         (4, 2, 6, 6), (2,), positive((2,)), (2,), (2,)),
    case("ops.pad", lambda x: ops.pad(x, (1, 1)), X),
    case("ops.interpolate", lambda x: ops.interpolate(x, scale_factor=2.0, recompute_scale_factor=True),
         (4, 2, 3, 3)),
    case("ops.pixel_shuffle", lambda x: ops.pixel_shuffle(x, 2), (4, 4, 2, 2)),
    case("ops.one_hot", lambda i: ops.one_hot(i, 6), index(6, (4, 2))),
    case("ops.cross_entropy", ops.cross_entropy, X, index(6, (4,))),
    case("ops.nll_loss", lambda x, t: ops.nll_loss(ops.log_softmax(x, 1), t), X, index(6, (4,))),
    case("ops.mse_loss", ops.mse_loss, X, X),
    case("ops.l1_loss", ops.l1_loss, X, X),
    case("ops.smooth_l1_loss", ops.smooth_l1_loss, X, X),
    case("ops.binary_cross_entropy", ops.binary_cross_entropy, prob(), prob()),
    case("ops.binary_cross_entropy_with_logits", lambda x, t: ops.binary_cross_entropy_with_logits(
        x, t, ops.ones_like(x), ops.ones_like(x)), X, prob()),
    case("ops.kl_div", lambda x, t: ops.kl_div(x, t, "sum"), X, prob()),
    case("ops.cosine_similarity", ops.cosine_similarity, X, X),
    case("ops.cdist", ops.cdist, X3, (4, 3, 6)),
    case("nn.SoftmaxCrossEntropyWithLogits", lambda x, t: nn.SoftmaxCrossEntropyWithLogits(
        sparse=True, reduction="mean")(x, t), X, index(6, (4,))),
    # -- indexing and gathering ------------------------------------------------------------------
    case("ops.gather (dim 0)", lambda x, i: ops.gather(x, i, 0), X, index(4, (3,))),
    case("ops.gather (dim 1)", lambda x, i: ops.gather(x, i, 1), X, index(6, (2, 2))),
    case("ops.gather_elements", lambda x, i: ops.gather_elements(x, 1, i), X, index(6, X)),
    case("ops.index_select", lambda x, i: ops.index_select(x, 1, i), X, index(6, (3,))),
    case("ops.masked_select", ops.masked_select, X, bools()),
    case("ops.nonzero", ops.nonzero, ints()),
    case("ops.topk", lambda x: ops.topk(x, 2), X),
    case("ops.sort", lambda x: ops.sort(x, 0), X),
    case("ops.argsort", lambda x: ops.argsort(x, 1), X),
    case("ops.unique", lambda x: ops.unique(x)[0], index(5, X)),
    case("ops.searchsorted", ops.searchsorted, Arg(X, "sorted"), X),
    case("ops.bincount", ops.bincount, index(5, (8,))),
    case("ops.scatter", lambda x, i, s: ops.scatter(x, 1, i, s), X, index(6, (4, 2)), (4, 2)),
    case("ops.tensor_scatter_elements (add)", lambda x, i, s: ops.tensor_scatter_elements(x, i, s, 1, "add"),
         X, index(6, (4, 2)), (4, 2)),
    case("ops.index_add", lambda x, i, s: (ops.index_add(x, i, s, 1), x), X, index(6, (2,)), (4, 2),
         note="writes its first operand (also compared)"),
    case("ops.index_fill", lambda x, i: ops.index_fill(x, 1, i, 0.5), X, index(6, (2,))),
    case("ops.tensor_scatter_elements", lambda x, i, s: ops.tensor_scatter_elements(x, i, s, 0),
         X, Arg((2, 6), "distinct4"), (2, 6)),
    case("x[1:3]", lambda x: x[1:3], X),
    case("x[:, 2]", lambda x: x[:, 2], X),
    case("x[..., None, ::2]", lambda x: x[..., None, ::2], X3),
    case("x[index tensor]", lambda x, i: x[i], X, index(4, (3,))),
    case("x[:, index tensor]", lambda x, i: x[:, i], X, index(6, (2,))),
    case("x[bool mask]", lambda x, m: x[m], X, bools()),
    # -- dtypes, creation, copies ---------------------------------------------------------------
    case("ops.cast", lambda x: ops.cast(x, ms.float16), X),
    case("Tensor.astype(int32)", lambda x: x.astype(ms.int32), X),
    case("Tensor.to(bool)", lambda x: x.to(ms.bool_), ints()),
    case("Tensor.copy()", lambda x: x.copy(), X),
    case("ops.zeros_like", ops.zeros_like, X),
    case("ops.ones_like", ops.ones_like, X),
    case("ops.full_like", lambda x: ops.full_like(x, 3.0), X),
    case("ops.stop_gradient", ops.stop_gradient, X),
    case("Tensor(d)", lambda x: Tensor(x), X),
    case("Tensor(d, dtype)", lambda x: Tensor(x, ms.float64), X),
    # -- in-place ops and Assign (DTensors follow the documented in-place semantics) ------------
    case("Tensor.add_", _inplace("add_"), X, X, reference=_out_of_place(ops.add)),
    case("Tensor.add_ (number)", lambda x: _inplace("add_")(x, 1.5), X,
         reference=_out_of_place(lambda x: x + 1.5)),
    case("Tensor.sub_", _inplace("sub_"), X, X, reference=_out_of_place(ops.sub)),
    case("Tensor.mul_", _inplace("mul_"), X, X, reference=_out_of_place(ops.mul)),
    case("Tensor.div_ (number)", lambda x: _inplace("div_")(x, 2.0), X,
         reference=_out_of_place(lambda x: x / 2.0)),
    case("Tensor.copy_", _inplace("copy_"), X, (6,), reference=_out_of_place(lambda x, y: ops.broadcast_to(y, X))),
    case("Tensor.exp_", _inplace("exp_"), X, reference=_out_of_place(ops.exp)),
    case("Tensor.floor_divide_", _inplace("floor_divide_"), X, positive(), reference=_out_of_place(ops.floor_divide)),
    case("ops.assign", lambda x, y: (ops.assign(x, y), x), X, X, reference=lambda x, y: (y, y)),
    case("ops.assign_add", lambda x, y: (ops.assign_add(x, y), x), X, X,
         reference=lambda x, y: (x + y, x + y)),
    case("ops.assign_sub", lambda x, y: (ops.assign_sub(x, y), x), X, X,
         reference=lambda x, y: (x - y, x - y)),
    case("x += y", lambda x, y: _iadd(x, y), X, X, reference=ops.add),
    # -- random ops: compared by the distribution's properties -----------------------------------
    case("ops.dropout", lambda x: ops.dropout(_ones(x), 0.25), X, check=_kept_or_dropped(0.25), partial=False),
    case("nn.Dropout", lambda x: _train(nn.Dropout(p=0.5))(_ones(x)), X, check=_kept_or_dropped(0.5), partial=False),
    case("ops.rand_like", ops.rand_like, X, check=_uniform_check, partial=False),
    case("ops.randn_like", ops.randn_like, X, check=_normal_check, partial=False),
    case("ops.bernoulli", lambda x: ops.bernoulli(x), prob(), check=lambda r, g: "" if np.isin(g, [0, 1]).all()
         else "values other than 0 and 1", partial=False),
)


def _seeded(make):
    """A Cell built with a fixed seed (the reference and every variant get the same weights)."""
    ms.set_seed(5)
    return make()


def _train(cell):
    cell.set_train(True)
    return cell


def _iadd(x, y):
    x += y
    return x
