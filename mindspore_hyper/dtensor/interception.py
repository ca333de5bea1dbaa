"""Close a gap in MindSpore's op interception for DTensors.

Old-style primitives (e.g. Stack, AddN) run through `mindspore.ops.primitive._run_op`; when their
DTensor operands sit inside a list or tuple argument, MindSpore computes on the placeholders
instead of calling `__fallback__` — silently wrong. `install()` wraps `_run_op` (in every
MindSpore module that imported it) so such calls go to the dispatcher too. Calls without a
DTensor inside a list/tuple argument take the original path unchanged.
"""
from __future__ import annotations

import sys

import mindspore.ops.primitive as primitive_module

from mindspore_hyper.dtensor.dtensor import DTensor

__all__ = ["install"]

_ORIGINAL = primitive_module._run_op


class _PrimitiveCall:
    """The original `_run_op` for one primitive, shaped like MindSpore's fallback `func`."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, obj, op_name, args):
        return _ORIGINAL(obj, op_name, args)


def _nested_dtensor(args):
    """The first DTensor inside a list/tuple argument, or None."""
    for a in args:
        if isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, DTensor):
                    return x
    return None


def _guarded_run_op(obj, op_name, args):
    found = _nested_dtensor(args)
    if found is not None:
        return found.execution.dispatch(_PrimitiveCall(op_name), (obj, op_name, tuple(args)), {})
    return _ORIGINAL(obj, op_name, args)


def install() -> None:
    """Replace `_run_op` in every loaded MindSpore module that holds the original (idempotent)."""
    for name, module in list(sys.modules.items()):
        if name.startswith("mindspore") and getattr(module, "_run_op", None) is _ORIGINAL:
            module._run_op = _guarded_run_op
