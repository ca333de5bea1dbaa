"""`torch.div` of two sizes, kept a size while exporting.

`torch.div(x.size(1), 2 * w, rounding_mode="trunc")` (Longformer's and LED's chunking) returns a 0-d int64
tensor, which the model then passes as a size (`x.view(b, n, 2 * w, d)`). Under torch.export a size read
back from a tensor is an unbacked symbol (`aten.item`): export knows nothing of its value, cannot check the
view against it ("Could not guard on data-dependent expression") and a Cell could not compute it. The value
is a size expression, so while exporting such a call returns the size itself (`x.size(1) // (2 * w)`, a
symbolic int where the size is symbolic): the same number, and arithmetic on it (`n - 1`) gives the same
numbers as on the tensor.

Only divisions of two Python/symbolic ints (never of a tensor) with rounding "floor", or "trunc" where
both operands are known non-negative (then trunc and floor agree), are changed; every other call runs as
written. Code that goes on to use the result as a tensor (`.item()`, `.to()`) fails to export with
AttributeError naming the line rather than computing something else.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["sizes_divided_as_sizes"]


def _is_size(value: Any) -> bool:
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


def _non_negative(value: Any) -> bool:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return value >= 0 if isinstance(value, int) else statically_known_true(value >= 0)


def size_quotient(a: Any, b: Any, rounding_mode: Optional[str]) -> Optional[Any]:
    """`a // b` when `torch.div(a, b, rounding_mode=...)` of sizes `a`, `b` has that value, else None."""
    if not (_is_size(a) and _is_size(b)) or isinstance(b, int) and b == 0:
        return None
    if rounding_mode == "floor" or rounding_mode == "trunc" and _non_negative(a) and _non_negative(b):
        return a // b
    return None


class _SizeDivision(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.div and len(args) == 2 and set(kwargs) == {"rounding_mode"}:
            quotient = size_quotient(args[0], args[1], kwargs["rounding_mode"])
            if quotient is not None:
                return quotient
        return func(*args, **kwargs)


@contextlib.contextmanager
def sizes_divided_as_sizes() -> Iterator[None]:
    """Inside: `torch.div` of two sizes with floor (or non-negative trunc) rounding returns the size `a // b`."""
    with _SizeDivision():
        yield
