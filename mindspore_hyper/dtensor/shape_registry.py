"""The registry of shape rules (op name -> rule) and `infer`, which applies them: an op's
output shapes and dtypes from its inputs' shapes and dtypes, without running it. The rules
themselves live in `shape_rules` (one section per op family)."""
from __future__ import annotations

import os
import traceback
from typing import Any, Callable, Dict, List

import mindspore as ms
from mindspore import Tensor
from mindspore.common.initializer import Zero
from mindspore.ops.primitive import Primitive

from mindspore_hyper.bfloat16_emulation import cell_cast_dtype

__all__ = ["SHAPE_RULES", "UNCAST_VIEW_OPS", "shape_rule", "infer", "ShapeRuleError", "describe", "user_line"]

Rule = Callable[[List[Any], Dict[str, Any], Dict[str, Any]], Any]
SHAPE_RULES: Dict[str, Rule] = {}


class ShapeRuleError(RuntimeError):
    """An op the dry run cannot infer (no rule, or inputs its rule does not accept)."""


def shape_rule(*names: str):
    """Register a rule for MindSpore op `names`."""
    def wrap(rule: Rule) -> Rule:
        for name in names:
            if name in SHAPE_RULES:
                raise ValueError(f"a shape rule for {name!r} is already registered")
            SHAPE_RULES[name] = rule
        return rule
    return wrap


def infer(func, args, kwargs, name: str = None) -> Any:
    """What op `func` returns on `args`/`kwargs` (MetaTensors among them), by its shape rule.

    Raises:
        ShapeRuleError: the op has no rule, or its rule refuses the inputs (names the op and line).
    """
    name = name or getattr(func, "name", type(func).__name__)
    attrs: Dict[str, Any] = {}
    if len(args) == 3 and isinstance(args[0], Primitive) and isinstance(args[1], str) and isinstance(args[2], tuple):
        attrs = dict(args[0].attrs)
        inputs = list(args[2])
    else:
        inputs = list(args)
    rule = SHAPE_RULES.get(name)
    if rule is None:
        where = user_line()
        raise ShapeRuleError(f"{name}: the dry run has no shape rule for this op{' (' + where + ')' if where else ''}; "
                             f"inputs {describe(inputs)}. Add one to mindspore_hyper/dtensor/shape_rules.py, "
                             "or run the script in simulation at a size this machine holds")
    cast = cell_cast_dtype() if name not in UNCAST_VIEW_OPS else None
    if cast is not None:  # a Cell with a mixed-precision type runs: its kernels get its dtype
        inputs, kwargs = _cast_floats(inputs, cast), dict(zip(kwargs, _cast_floats(list(kwargs.values()), cast)))
    try:
        out = rule(inputs, dict(kwargs), attrs)
    except ShapeRuleError:
        raise
    except Exception as error:
        where = user_line()
        raise ShapeRuleError(f"{name}: its shape rule refused inputs {describe(inputs)}"
                             f"{' (' + where + ')' if where else ''}: {error}") from error
    grad = any(getattr(t, "grad_path", False) for t in _tensors(inputs) + _tensors(list(kwargs.values())))
    for t in _tensors(out if isinstance(out, (tuple, list)) else [out]):
        t.grad_path = grad and _is_float(t.dtype)
    return out


# ops MindSpore's kernel launch does not cast to a mixed-precision Cell's dtype (views and
# copies keep their input's dtype; checked on MindSpore 2.10 by running each inside a Cell made
# float16 by `to_float`: Reshape, Transpose, permute, view, flatten, narrow, chunk, expand_dims,
# squeeze, unsqueeze, broadcast_to, a split into equal parts, indexing by an int, contiguous,
# copy and astype kept float32, while ops.split into a list of sizes and unbind were cast)
UNCAST_VIEW_OPS = frozenset({
    "Reshape", "View", "Transpose", "TransposeView", "TransposeExtView", "TransposeExt", "Permute", "Flatten",
    "FlattenExt", "Narrow", "NarrowView", "Chunk", "ChunkView", "ExpandDims", "ExpandDimsView", "Squeeze",
    "Unsqueeze", "BroadcastTo", "BroadcastToView", "Split", "SplitTensor", "SplitTensorView", "SelectExtView",
    "Contiguous", "Clone", "Copy", "Cast", "DeprecatedTranspose", "DeprecatedReshape", "DeprecatedSplit"})


def _cast_floats(values: List[Any], dtype) -> List[Any]:
    """`values` with every float tensor of another dtype as a MetaTensor of `dtype` (lists and
    tuples of tensors too): MindSpore's kernel launch casts a mixed-precision Cell's float inputs
    so (amp O2/O3, `Cell.to_float`), the float32 weights among them. A cast input is a
    placeholder of its own class (a MetaTensor stays one) that is never materialised."""
    out = []
    for v in values:
        if isinstance(v, Tensor) and _is_float(v.dtype) and v.dtype != dtype:
            cast = Tensor(shape=tuple(v.shape), dtype=dtype, init=Zero())
            if type(v) is not Tensor:
                cast = Tensor._make_subclass(type(v), cast)
                cast.grad_path = getattr(v, "grad_path", False)
            out.append(cast)
        elif isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
            out.append(type(v)(_cast_floats(list(v), dtype)))
        else:
            out.append(v)
    return out


def describe(values) -> str:
    parts = []
    for v in values:
        if isinstance(v, Tensor):
            parts.append(f"{tuple(v.shape)} {v.dtype}")
        elif isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
            parts.append("[" + describe(v) + "]")
        else:
            parts.append(repr(v))
    return ", ".join(parts)


def _tensors(values) -> List[Tensor]:
    out = []
    for v in values:
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors(v))
    return out


def _is_float(dtype) -> bool:
    return dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16)


def user_line() -> str:
    """The innermost stack frame outside MindSpore, NumPy and this package ("file:line: code"),
    or "" when there is none: the model line an error should point at."""
    skip = ("mindspore", "numpy", "mindspore_hyper")
    for frame in reversed(traceback.extract_stack()[:-1]):
        parts = os.path.normpath(frame.filename).split(os.sep)
        if any(p in skip for p in parts) or "site-packages" in parts or frame.filename.startswith("<"):
            continue
        return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return ""
