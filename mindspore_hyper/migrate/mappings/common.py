"""Shared helpers of the mapping modules: literals in generated code, argument checks, call text."""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from mindspore_hyper.migrate.mappings.registry import NOT_CONSTANT, Arg, Unsupported

__all__ = ["DTYPES", "render_literal", "literal", "call", "in_float64", "expect", "sizes", "ms_dtype", "subscript",
           "is_python"]

DTYPES = {
    torch.float32: "ms.float32", torch.float16: "ms.float16", torch.bfloat16: "ms.bfloat16",
    torch.float64: "ms.float64", torch.int64: "ms.int64", torch.int32: "ms.int32", torch.int16: "ms.int16",
    torch.int8: "ms.int8", torch.uint8: "ms.uint8", torch.bool: "ms.bool_", torch.complex64: "ms.complex64",
}


def ms_dtype(dtype: torch.dtype) -> str:
    """The MindSpore dtype expression of a torch dtype."""
    if dtype not in DTYPES:
        raise Unsupported(f"dtype {dtype} has no MindSpore equivalent here")
    return DTYPES[dtype]


def render_literal(value: Any) -> str:
    """Python source of a conversion-time value (torch dtypes, sizes, slices, numbers, ...)."""
    if isinstance(value, torch.dtype):
        return ms_dtype(value)
    if isinstance(value, torch.Size):
        return repr(tuple(value))
    if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
        return "None"
    if isinstance(value, float):
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        if math.isnan(value):
            return "float('nan')"
        return repr(value)
    if isinstance(value, (bool, int, str)) or value is None or value is Ellipsis:
        return "..." if value is Ellipsis else repr(value)
    if isinstance(value, tuple):
        inner = ", ".join(render_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(render_literal(v) for v in value) + "]"
    if isinstance(value, slice):
        return f"slice({render_literal(value.start)}, {render_literal(value.stop)}, {render_literal(value.step)})"
    raise Unsupported(f"the literal {value!r} ({type(value).__name__}) cannot be written as MindSpore code")


def literal(value: Any) -> Arg:
    """An Arg of a conversion-time value."""
    return Arg(render_literal(value), value, value)


def call(fn: str, *args: Any, **kwargs: Any) -> str:
    """`fn(a, b, k=v)`; keyword arguments whose value is None are left out."""
    parts = [str(a) for a in args]
    parts += [f"{k}={v}" for k, v in kwargs.items() if v is not None and getattr(v, "value", 0) is not None]
    return f"{fn}({', '.join(parts)})"


def in_float64(fn: str, x: Arg, *args: Any, **kwargs: Any) -> str:
    """`fn(x, *args, **kwargs)` through the helper `in_float64_on_cpu`: on the CPU a float32 `x` is computed
    in float64 and rounded back, elsewhere (other dtypes, Ascend/GPU kernels) `fn(x)` as is.

    Why: MindSpore 2.10's vectorised CPU float32 tanh is up to 1e-4 from exact (its gradient 2e-4) where
    torch's is within 3e-8 (measured against float64 on randn * 3 inputs, relative to the largest value);
    its float64 kernel is within float32's rounding, so the float32 result is the correctly rounded one to
    within an ulp. Decided at run time, so a Cell converted here runs the device's own kernel on Ascend.
    """
    return call("in_float64_on_cpu", fn, x, *args, **kwargs)


def expect(arg: Any, allowed: Sequence[Any], what: str) -> None:
    """Raise Unsupported unless `arg` (Arg or value) is one of `allowed` (e.g. a default)."""
    value = arg.value if isinstance(arg, Arg) else arg
    if type(value) is not list and isinstance(value, list):  # torch.fx's immutable_list (export's size lists)
        value = list(value)
    if value is NOT_CONSTANT or not any(value == a and type(value) is type(a) or value is a for a in allowed):
        shown = arg.code if isinstance(arg, Arg) else repr(arg)
        raise Unsupported(f"{what}={shown} is not supported (supported: {', '.join(map(repr, allowed))})")


def sizes(args: Sequence[Arg]) -> Arg:
    """One tuple Arg from varargs sizes: `x.view(2, 3)` and `x.view((2, 3))` both give `(2, 3)`."""
    if len(args) == 1 and args[0].items is not None:
        items = args[0].items
    elif len(args) == 1 and args[0].is_constant and isinstance(args[0].value, (tuple, list, torch.Size)):
        items = [literal(v) for v in args[0].value]
    else:
        items = list(args)
    code = "(" + ", ".join(str(a) for a in items) + ("," if len(items) == 1 else "") + ")"
    value = tuple(a.value for a in items) if all(a.is_constant for a in items) else NOT_CONSTANT
    return Arg(code, value, None, items, "tuple")


def _index_part(part: Any) -> str:
    """One element of a subscript: `a:b:c`, `None`, `...` or an expression."""
    if isinstance(part, Arg) and part.kind == "slice":
        start, stop, step = (("" if p.value is None else str(p)) for p in part.items)
        return f"{start}:{stop}" + (f":{step}" if step else "")
    value = part.value if isinstance(part, Arg) else part
    if isinstance(value, slice):
        return _index_part(Arg("", NOT_CONSTANT, None, [literal(value.start), literal(value.stop),
                                                          literal(value.step)], "slice"))
    if isinstance(part, Arg):
        return part.code
    return render_literal(part)


def subscript(index: Arg) -> str:
    """The text inside `x[...]` for a torch index (ints, slices, None, Ellipsis, tensors, tuples of them)."""
    if index.kind == "tuple" or index.kind == "list" and any(i.is_tensor for i in index.items):
        parts = index.items
    elif index.is_constant and isinstance(index.value, tuple):
        parts = list(index.value)
    else:
        return _index_part(index)
    if not parts:
        return "()"
    return ", ".join(_index_part(p) for p in parts) + ("," if len(parts) == 1 else "")


def is_python(*args: Arg) -> bool:
    """True when no argument is a tensor: the op runs on Python numbers (shape arithmetic)."""
    return not any(a.is_tensor for a in args)
