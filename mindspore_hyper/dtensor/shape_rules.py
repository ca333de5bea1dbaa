"""Shape rules, by op family: an op's output shapes and dtypes from its inputs' shapes and dtypes, without
running it (the dry run's replacement for a kernel).

One rule per op, registered (`shape_registry`) by MindSpore op name (as `func.name` reports it). A rule gets
the op's positional inputs (MetaTensors, scalars, tuples), its keyword arguments and the
primitive's attributes, and returns what the op would return: MetaTensors of the inferred shape
and dtype. An op without a rule stops the dry run with its name and the script line: a guessed
shape would make every figure after it wrong. Each rule is checked against MindSpore's real op
on the package's and MindSpore's own models (tests/dtensor/test_shape_rules.py).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Sequence, Tuple

import mindspore as ms
from mindspore._c_expression.typing import type_id_to_type
from mindspore.common import dtype as mstype
import numpy as np
from mindspore import Tensor
from mindspore.ops.primitive import Primitive

from mindspore_hyper.dtensor.meta import MetaTensor, meta
from mindspore_hyper.dtensor.shape_registry import shape_rule

__all__ = ["broadcast_shapes", "promote", "reduced", "reshaped"]

def _like(t: Tensor, shape=None, dtype=None) -> MetaTensor:
    return meta(tuple(t.shape) if shape is None else shape, t.dtype if dtype is None else dtype)


# -- shapes and dtypes ---------------------------------------------------------------------------

def broadcast_shapes(*shapes: Sequence[int]) -> Tuple[int, ...]:
    """NumPy broadcasting of `shapes`.

    Raises:
        ValueError: the shapes do not broadcast.
    """
    return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))


_FLOAT_RANK = {ms.float16: 1, ms.bfloat16: 1, ms.float32: 2, ms.float64: 3}
_INT_RANK = {ms.bool_: 0, ms.uint8: 1, ms.int8: 1, ms.int16: 2, ms.int32: 3, ms.int64: 4}


def promote(values) -> Any:
    """The result dtype of an elementwise op on `values` (tensors and Python scalars), by
    MindSpore's promotion: tensors decide among themselves (float beats int, wider beats
    narrower; float16 with bfloat16 gives float32); a Python float makes an integer or bool
    tensor float32; a Python int makes a bool tensor int64."""
    tensors = [v for v in values if isinstance(v, Tensor)]
    dtypes = {t.dtype for t in tensors}
    floats = [d for d in dtypes if d in _FLOAT_RANK]
    if floats:
        if {ms.float16, ms.bfloat16} <= set(floats) and max(_FLOAT_RANK[d] for d in floats) == 1:
            return ms.float32
        return max(floats, key=lambda d: _FLOAT_RANK[d])
    if any(isinstance(v, float) for v in values):
        return ms.float32
    ints = [d for d in dtypes if d in _INT_RANK]
    if ints:
        best = max(ints, key=lambda d: _INT_RANK[d])
        if best == ms.bool_ and any(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return ms.int64
        return best
    raise ValueError(f"no dtype rule for operands of dtypes {sorted(str(d) for d in dtypes)}")


def _dim(d: int, ndim: int) -> int:
    if not -max(ndim, 1) <= d < max(ndim, 1):
        raise ValueError(f"dimension {d} out of range for a {ndim}-d tensor")
    return d % max(ndim, 1)


def _dims(axis, ndim: int) -> Tuple[int, ...]:
    if axis is None or axis == () or axis == []:
        return tuple(range(ndim))
    if isinstance(axis, int):
        return (_dim(axis, ndim),)
    return tuple(sorted(_dim(int(a), ndim) for a in axis))


def reduced(shape: Sequence[int], axis, keep: bool) -> Tuple[int, ...]:
    """`shape` reduced over `axis` (None or () = all dimensions)."""
    dims = _dims(axis, len(shape))
    if keep:
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


def reshaped(shape: Sequence[int], target: Sequence[int]) -> Tuple[int, ...]:
    """`target` with its -1 resolved against the element count of `shape`.

    Raises:
        ValueError: the element counts differ or more than one -1.
    """
    target = [int(n) for n in target]
    total = math.prod(shape)
    if target.count(-1) > 1:
        raise ValueError(f"reshape target {tuple(target)} has more than one -1")
    if -1 in target:
        known = math.prod(n for n in target if n != -1)
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape {tuple(shape)} to {tuple(target)}")
        target[target.index(-1)] = total // known
    if math.prod(target) != total:
        raise ValueError(f"cannot reshape {tuple(shape)} ({total} elements) to {tuple(target)}")
    return tuple(target)


# -- elementwise -----------------------------------------------------------------------------------

_UNARY = ("Exp", "Log", "Neg", "GeLU", "FastGeLU", "Sigmoid", "SiLU", "Tanh", "Sqrt", "Rsqrt", "Abs", "Square",
          "Erf", "ReLU", "Relu", "Reciprocal", "Sin", "Cos", "OnesLike", "ZerosLike", "Softmax", "LogSoftmax",
          "SoftmaxExt", "LogSoftmaxExt", "Log1p", "Expm1", "Floor", "Ceil", "Round", "Sign", "Identity", "DeepCopy",
          "Contiguous", "Clone", "LeakyReLU", "LeakyReLUExt", "HSwish", "Softplus", "ClampScalar", "Elu", "GeluExt",
          "SiLUExt", "Mish", "Erfinv", "InplaceCopy", "InsertGradientOf")


@shape_rule(*_UNARY)
def _unary(inputs, kwargs, attrs):
    return _like(inputs[0])


@shape_rule("CellBackwardHook")
def _cell_backward_hook(inputs, kwargs, attrs):
    """The identity op MindSpore puts around a hooked Cell's tensors: one output per tensor of the
    list it takes, of its shape and dtype, as a tuple."""
    return tuple(_like(t) for t in inputs[0])


@shape_rule("AddExt", "SubExt", "Add", "Sub", "Mul", "Div", "RealDiv", "Pow", "Maximum", "Minimum", "Muls", "Divs",
            "Adds", "SubScalar", "AddScalar", "FloorDiv", "Mod", "Remainder", "Atan2", "SquaredDifference", "DivMod",
            "BitwiseAnd", "BitwiseOr", "Xdivy", "PowTensorScalar", "PowScalarTensor", "InplaceAddExt",
            "InplaceMul", "InplaceDiv", "InplaceSubExt")
def _binary(inputs, kwargs, attrs):
    operands = [v for v in inputs if isinstance(v, (Tensor, int, float, bool)) and v is not None][:2]
    tensors = [v for v in operands if isinstance(v, Tensor)]
    shape = broadcast_shapes(*[t.shape for t in tensors])
    dtype = promote(operands)
    return meta(shape, dtype)


@shape_rule("Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr",
            "LogicalNot", "IsNan", "IsInf", "IsFinite", "EqualExt", "GreaterEqualScalar", "LessScalar")
def _compare(inputs, kwargs, attrs):
    tensors = [v for v in inputs if isinstance(v, Tensor)]
    return meta(broadcast_shapes(*[t.shape for t in tensors]), ms.bool_)


@shape_rule("MaskedFill", "MaskedFillScalar")
def _masked_fill(inputs, kwargs, attrs):
    x, mask = inputs[0], inputs[1]
    return meta(broadcast_shapes(x.shape, mask.shape), x.dtype)


@shape_rule("Select", "Where")
def _select(inputs, kwargs, attrs):
    cond, x, y = inputs[:3]
    shapes = [v.shape for v in (cond, x, y) if isinstance(v, Tensor)]
    return meta(broadcast_shapes(*shapes), promote([x, y]))


@shape_rule("BiasAdd")
def _bias_add(inputs, kwargs, attrs):
    x, bias = inputs[0], inputs[1]
    if bias.ndim != 1:
        raise ValueError(f"bias of shape {tuple(bias.shape)} is not 1-d")
    return _like(x)


@shape_rule("Cast", "ToDtype")
def _cast(inputs, kwargs, attrs):
    dtype = inputs[1]
    if isinstance(dtype, int) and not isinstance(dtype, bool):  # MindSpore's TypeId, as its kernels pass it
        dtype = type_id_to_type(dtype)
    return _like(inputs[0], dtype=dtype)


# -- reductions ----------------------------------------------------------------------------------

@shape_rule("SumExt", "MeanExt", "ProdExt")
def _reduce_ext(inputs, kwargs, attrs):
    x = inputs[0]
    dim = inputs[1] if len(inputs) > 1 else None
    keep = bool(inputs[2]) if len(inputs) > 2 else False
    dtype = inputs[3] if len(inputs) > 3 and inputs[3] is not None else x.dtype
    if dtype in _INT_RANK and inputs[0].dtype in _INT_RANK:
        dtype = ms.int64
    return meta(reduced(x.shape, dim, keep), dtype)


@shape_rule("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceAll", "ReduceAny")
def _reduce(inputs, kwargs, attrs):
    x = inputs[0]
    axis = inputs[1] if len(inputs) > 1 else ()
    keep = bool(inputs[2]) if len(inputs) > 2 else bool(attrs.get("keep_dims", False))
    return _like(x, shape=reduced(x.shape, axis, keep))


@shape_rule("DeprecatedSum", "DeprecatedMean")
def _deprecated_sum(inputs, kwargs, attrs):
    x = inputs[0]
    axis = kwargs.get("axis", inputs[1] if len(inputs) > 1 else None)
    keep = kwargs.get("keepdims", kwargs.get("keep_dims", inputs[2] if len(inputs) > 2 else False))
    return _like(x, shape=reduced(x.shape, axis, bool(keep)))


@shape_rule("Min", "Max")
def _min_max(inputs, kwargs, attrs):
    if len(inputs) > 1:
        raise ValueError("Min/Max over a dimension")
    return _like(inputs[0], shape=())


@shape_rule("ArgMaxExt", "DeprecatedArgmax", "ArgMinExt", "DeprecatedArgmin")
def _argmax(inputs, kwargs, attrs):
    x = inputs[0]
    axis = inputs[1] if len(inputs) > 1 else None
    keep = bool(inputs[2]) if len(inputs) > 2 and isinstance(inputs[2], bool) else False
    return meta(reduced(x.shape, axis, keep), ms.int64)


@shape_rule("TopkExt", "TopK")
def _topk(inputs, kwargs, attrs):
    x, k = inputs[0], int(inputs[1])
    dim = inputs[2] if len(inputs) > 2 and isinstance(inputs[2], int) and not isinstance(inputs[2], bool) else -1
    d = _dim(dim, x.ndim)
    shape = tuple(k if i == d else n for i, n in enumerate(x.shape))
    return meta(shape, x.dtype), meta(shape, ms.int64 if attrs == {} else ms.int32)


@shape_rule("CumsumExt", "CumSum", "Cumsum")
def _cumsum(inputs, kwargs, attrs):
    return _like(inputs[0])


# -- matrix products -----------------------------------------------------------------------------

@shape_rule("MatMul")
def _matmul(inputs, kwargs, attrs):
    a, b = inputs[0], inputs[1]
    ta = bool(inputs[2]) if len(inputs) > 2 else bool(attrs.get("transpose_a", False))
    tb = bool(inputs[3]) if len(inputs) > 3 else bool(attrs.get("transpose_b", False))
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError("MatMul takes 2-d operands")
    m, k = (a.shape[1], a.shape[0]) if ta else tuple(a.shape)
    k2, n = (b.shape[1], b.shape[0]) if tb else tuple(b.shape)
    if k != k2:
        raise ValueError(f"inner dimensions {k} and {k2} differ")
    return meta((m, n), promote([a, b]))


@shape_rule("BatchMatMul")
def _batch_matmul(inputs, kwargs, attrs):
    a, b = inputs[0], inputs[1]
    ta = bool(inputs[2]) if len(inputs) > 2 else bool(attrs.get("transpose_a", False))
    tb = bool(inputs[3]) if len(inputs) > 3 else bool(attrs.get("transpose_b", False))
    sa = tuple(a.shape[:-2]) + ((a.shape[-1], a.shape[-2]) if ta else tuple(a.shape[-2:]))
    sb = tuple(b.shape[:-2]) + ((b.shape[-1], b.shape[-2]) if tb else tuple(b.shape[-2:]))
    return meta(_matmul_shape(sa, sb), promote([a, b]))


@shape_rule("MatMulExt", "BatchMatMulExt", "Bmm", "BmmExt")
def _matmul_ext(inputs, kwargs, attrs):
    a, b = inputs[0], inputs[1]
    return meta(_matmul_shape(tuple(a.shape), tuple(b.shape)), promote([a, b]))


def _matmul_shape(sa: Tuple[int, ...], sb: Tuple[int, ...]) -> Tuple[int, ...]:
    """numpy.matmul's result shape (1-d operands promoted and the added dimension dropped)."""
    if not sa or not sb:
        raise ValueError("matmul of a 0-d operand")
    a2 = (1,) + sa if len(sa) == 1 else sa
    b2 = sb + (1,) if len(sb) == 1 else sb
    if a2[-1] != b2[-2]:
        raise ValueError(f"inner dimensions {a2[-1]} and {b2[-2]} differ")
    out = broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(sa) == 1:
        out = out[:-2] + out[-1:]
    if len(sb) == 1:
        out = out[:-1]
    return out


@shape_rule("Dense")
def _dense(inputs, kwargs, attrs):
    x, w = inputs[0], inputs[1]
    if x.shape[-1] != w.shape[-1]:
        raise ValueError(f"input features {x.shape[-1]} vs weight {tuple(w.shape)}")
    return meta(tuple(x.shape[:-1]) + (w.shape[0],) if w.ndim == 2 else tuple(x.shape[:-1]), promote([x, w]))


# -- layout ops ----------------------------------------------------------------------------------

@shape_rule("Reshape", "View")
def _reshape(inputs, kwargs, attrs):
    x, target = inputs[0], inputs[1:] if len(inputs) > 2 or isinstance(inputs[1], int) else inputs[1]
    if isinstance(target, Tensor):
        raise ValueError("a reshape target given as a tensor has no value in a dry run")
    return _like(x, shape=reshaped(x.shape, target))


@shape_rule("Transpose", "Permute")
def _transpose(inputs, kwargs, attrs):
    x, perm = inputs[0], tuple(int(p) for p in inputs[1])
    if sorted(_dim(p, x.ndim) for p in perm) != list(range(x.ndim)):
        raise ValueError(f"permutation {perm} of a {x.ndim}-d tensor")
    return _like(x, shape=tuple(x.shape[_dim(p, x.ndim)] for p in perm))


@shape_rule("DeprecatedTranspose")
def _deprecated_transpose(inputs, kwargs, attrs):
    x, perm = inputs[0], inputs[1:]
    if len(perm) == 1 and isinstance(perm[0], (tuple, list)):
        perm = perm[0]
    return _transpose([x, tuple(perm)], kwargs, attrs)


@shape_rule("TransposeExtView", "TransposeExt", "Swapaxes")
def _swap(inputs, kwargs, attrs):
    x, d0, d1 = inputs[0], _dim(inputs[1], inputs[0].ndim), _dim(inputs[2], inputs[0].ndim)
    shape = list(x.shape)
    shape[d0], shape[d1] = shape[d1], shape[d0]
    return _like(x, shape=tuple(shape))


@shape_rule("ExpandDims", "ExpandDimsView", "Unsqueeze")
def _expand_dims(inputs, kwargs, attrs):
    x, d = inputs[0], int(inputs[1])
    d = d % (x.ndim + 1)
    shape = list(x.shape)
    shape.insert(d, 1)
    return _like(x, shape=tuple(shape))


@shape_rule("Squeeze")
def _squeeze(inputs, kwargs, attrs):
    x = inputs[0]
    axis = inputs[1] if len(inputs) > 1 else attrs.get("axis", ())
    dims = _dims(axis, x.ndim) if axis not in (None, (), []) else tuple(i for i, n in enumerate(x.shape) if n == 1)
    return _like(x, shape=tuple(n for i, n in enumerate(x.shape) if not (i in dims and n == 1)))


@shape_rule("Split")
def _split(inputs, kwargs, attrs):
    x, axis, count = inputs[0], int(inputs[1]), int(inputs[2])
    d = _dim(axis, x.ndim)
    if x.shape[d] % count:
        raise ValueError(f"dimension {d} of size {x.shape[d]} does not split into {count}")
    shape = tuple(n // count if i == d else n for i, n in enumerate(x.shape))
    return tuple(_like(x, shape=shape) for _ in range(count))


@shape_rule("SplitTensor", "SplitWithSize", "SplitTensorView", "SplitWithSizeView")
def _split_sizes(inputs, kwargs, attrs):
    x, size, dim = inputs[0], inputs[1], int(inputs[2]) if len(inputs) > 2 else 0
    d = _dim(dim, x.ndim)
    total = x.shape[d]
    sizes = list(size) if isinstance(size, (tuple, list)) else [size] * (total // size) + (
        [total % size] if total % size else [])
    if sum(sizes) != total:
        raise ValueError(f"sizes {sizes} do not add up to dimension {d} of size {total}")
    return tuple(_like(x, shape=tuple(s if i == d else n for i, n in enumerate(x.shape))) for s in sizes)


@shape_rule("Concat", "Cat")
def _concat(inputs, kwargs, attrs):
    tensors = list(inputs[0])
    axis = int(inputs[1]) if len(inputs) > 1 else int(attrs.get("axis", 0))
    d = _dim(axis, tensors[0].ndim)
    base = list(tensors[0].shape)
    for t in tensors[1:]:
        if t.ndim != len(base) or any(n != m for i, (n, m) in enumerate(zip(t.shape, base)) if i != d):
            raise ValueError(f"concatenating shapes {[tuple(x.shape) for x in tensors]} along {d}")
    base[d] = sum(t.shape[d] for t in tensors)
    return meta(tuple(base), promote(tensors))


@shape_rule("Stack", "StackExt")
def _stack(inputs, kwargs, attrs):
    tensors = list(inputs[0])
    axis = int(inputs[1]) if len(inputs) > 1 else int(attrs.get("axis", 0))
    shape = list(tensors[0].shape)
    if any(tuple(t.shape) != tuple(shape) for t in tensors):
        raise ValueError(f"stacking shapes {[tuple(x.shape) for x in tensors]}")
    shape.insert(axis % (len(shape) + 1), len(tensors))
    return meta(tuple(shape), promote(tensors))


@shape_rule("Unstack", "UnstackExtView")
def _unstack(inputs, kwargs, attrs):
    x = inputs[0]
    axis = _dim(int(inputs[1]) if len(inputs) > 1 else int(attrs.get("axis", 0)), x.ndim)
    shape = tuple(n for i, n in enumerate(x.shape) if i != axis)
    return tuple(_like(x, shape=shape) for _ in range(x.shape[axis]))


@shape_rule("BroadcastTo", "BroadcastToView")
def _broadcast_to(inputs, kwargs, attrs):
    x, shape = inputs[0], tuple(inputs[1])
    pad = (1,) * (len(shape) - x.ndim) + tuple(x.shape)
    out = tuple(n if n != -1 else m for n, m in zip(shape, pad))
    broadcast_shapes(pad, out)
    return _like(x, shape=out)


@shape_rule("Tile")
def _tile(inputs, kwargs, attrs):
    x, reps = inputs[0], tuple(inputs[1])
    shape = (1,) * (len(reps) - x.ndim) + tuple(x.shape)
    reps = (1,) * (len(shape) - len(reps)) + reps
    return _like(x, shape=tuple(n * r for n, r in zip(shape, reps)))


@shape_rule("getitem")
def _getitem(inputs, kwargs, attrs):
    """Basic indexing (ints, slices, None, Ellipsis): NumPy's rule on a zero-strided view."""
    x, index = inputs[0], inputs[1]
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, (Tensor, list, np.ndarray)) for i in items):
        raise ValueError("indexing by a tensor has a data-dependent or gathered shape")
    view = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape=tuple(x.shape), strides=(0,) * x.ndim)
    return _like(x, shape=view[index].shape)


@shape_rule("StridedSlice")
def _strided_slice(inputs, kwargs, attrs):
    """Python slicing per dimension; begin/end masks take the whole range, shrink drops the
    dimension; ellipsis and new-axis masks are refused."""
    x, begin, end, strides = inputs[0], tuple(inputs[1]), tuple(inputs[2]), tuple(inputs[3])
    masks = [int(m) for m in inputs[4:9]] if len(inputs) >= 9 else [int(attrs.get(k, 0)) for k in (
        "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")]
    begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_mask = masks
    if ellipsis_mask or new_axis_mask:
        raise ValueError("StridedSlice with an ellipsis or new-axis mask")
    shape = []
    for d, n in enumerate(x.shape):
        if d >= len(begin):
            shape.append(n)
            continue
        if shrink_mask >> d & 1:
            continue
        start = None if begin_mask >> d & 1 else begin[d]
        stop = None if end_mask >> d & 1 else end[d]
        shape.append(len(range(n)[slice(start, stop, strides[d])]))
    return _like(x, shape=tuple(shape))


@shape_rule("Gather")
def _gather(inputs, kwargs, attrs):
    params, indices = inputs[0], inputs[1]
    axis = _dim(int(inputs[2]) if len(inputs) > 2 else 0, params.ndim)
    batch_dims = int(inputs[3]) if len(inputs) > 3 else int(attrs.get("batch_dims", 0))
    shape = tuple(params.shape[:axis]) + tuple(indices.shape[batch_dims:]) + tuple(params.shape[axis + 1:])
    return _like(params, shape=shape)


@shape_rule("Embedding")
def _embedding(inputs, kwargs, attrs):
    ids, weight = inputs[0], inputs[1]
    return _like(weight, shape=tuple(ids.shape) + tuple(weight.shape[1:]))


@shape_rule("GatherD", "GatherDGradV2")
def _gather_d(inputs, kwargs, attrs):
    x, index = inputs[0], inputs[2]
    return _like(x, shape=tuple(index.shape))


@shape_rule("UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin")
def _segment_sum(inputs, kwargs, attrs):
    x, ids, segments = inputs[0], inputs[1], int(inputs[2])
    return _like(x, shape=(segments,) + tuple(x.shape[ids.ndim:]))


@shape_rule("OneHot", "OneHotExt")
def _one_hot(inputs, kwargs, attrs):
    ids, depth = inputs[0], int(inputs[1])
    on = inputs[2] if len(inputs) > 2 and isinstance(inputs[2], Tensor) else None
    return meta(tuple(ids.shape) + (depth,), on.dtype if on is not None else ms.int64)


# -- normalisation and losses ------------------------------------------------------------------

@shape_rule("LayerNorm")
def _layer_norm(inputs, kwargs, attrs):
    x = inputs[0]
    begin = int(inputs[3]) if len(inputs) > 3 else int(attrs.get("begin_norm_axis", -1))
    begin = _dim(begin, x.ndim)
    stats = tuple(n if i < begin else 1 for i, n in enumerate(x.shape))
    return _like(x), meta(stats, ms.float32 if x.dtype != ms.float64 else x.dtype), \
        meta(stats, ms.float32 if x.dtype != ms.float64 else x.dtype)


@shape_rule("LayerNormExt")
def _layer_norm_ext(inputs, kwargs, attrs):
    x, normalized = inputs[0], tuple(inputs[1])
    stats = tuple(x.shape[:x.ndim - len(normalized)]) + (1,) * len(normalized)
    return _like(x), meta(stats, ms.float32), meta(stats, ms.float32)


@shape_rule("RmsNorm")
def _rms_norm(inputs, kwargs, attrs):
    x, gamma = inputs[0], inputs[1]
    stats = tuple(x.shape[:x.ndim - gamma.ndim]) + (1,) * gamma.ndim
    return _like(x), meta(stats, ms.float32)


@shape_rule("SparseSoftmaxCrossEntropyWithLogits")
def _sparse_ce(inputs, kwargs, attrs):
    logits = inputs[0]
    if attrs.get("is_grad", False):
        return _like(logits)
    return meta((), logits.dtype)


@shape_rule("SoftmaxCrossEntropyWithLogits")
def _dense_ce(inputs, kwargs, attrs):
    logits = inputs[0]
    return meta((logits.shape[0],), logits.dtype), _like(logits)


@shape_rule("CrossEntropyLoss", "NLLLoss")
def _cross_entropy(inputs, kwargs, attrs):
    logits = inputs[0]
    reduction = attrs.get("reduction", "mean")
    return meta(() if reduction != "none" else (logits.shape[0],), logits.dtype), meta((), logits.dtype)


@shape_rule("Dropout")
def _dropout(inputs, kwargs, attrs):
    return _like(inputs[0]), _like(inputs[0])


@shape_rule("DropoutExt")
def _dropout_ext(inputs, kwargs, attrs):
    x = inputs[0]
    return _like(x), meta(((math.prod(x.shape) + 127) // 128 * 16,), ms.uint8)


# -- queries and factories -----------------------------------------------------------------------

@shape_rule("typeof")
def _typeof(inputs, kwargs, attrs):
    return mstype.TensorType(inputs[0].dtype)
