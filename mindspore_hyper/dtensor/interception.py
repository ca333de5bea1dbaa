"""Close the gaps in MindSpore's op interception for DTensors.

MindSpore hands an op to `DTensor.__fallback__` when a DTensor is the object it dispatches on.
Three paths miss it and would compute on a DTensor's never-materialised placeholder or fail
with an unclear error; `install()` routes each to the dispatcher:

- Old-style primitives (e.g. Stack, AddN) run through `mindspore.ops.primitive._run_op`; with
  DTensor operands inside a list or tuple argument MindSpore computes on the placeholders —
  silently wrong. `_run_op` is wrapped (in every MindSpore module that imported it).
- A plain Tensor as the object of a call with a DTensor operand (`x.add(d)`, `x.matmul(d)`,
  `x += d`) makes MindSpore look up `__fallback__` on the plain Tensor ("Cannot found
  __fallback__ attr"); `Tensor.__fallback__` forwards such calls to the DTensor's dispatcher.
- `Tensor(d)` / `mindspore.tensor(d)` copy a tensor's own storage — a DTensor's placeholder;
  they copy the gathered global value instead (like `d.asnumpy()`).
- Indexing a plain Tensor with DTensor indices (`x[d]`) or assigning DTensors into it
  (`x[i] = d`) reads placeholders; `x[d]` runs as an op on DTensors, and `x[i] = d` assigns
  the gathered values.

- `mindspore.grad` / `value_and_grad` of a function returning DTensors would differentiate
  their never-materialised placeholders: gradients of zero, silently. A function's DTensor
  outputs are returned by their global values (`full_tensor()`, differentiable), as a DTensor
  loss differentiates in torch; a Cell returning DTensors, and a rank-local output (no global
  value), are refused with the fix. The functions in `BACKWARD_LISTENERS` are called as the
  backward begins (the HyperParallel API marks a script-driven step's phases with it).

Calls without DTensors take MindSpore's original paths unchanged.
"""
from __future__ import annotations

import functools
import sys
import weakref

import mindspore.ops.composite.base as grad_module
import mindspore.ops.primitive as primitive_module
from mindspore import Tensor
from mindspore.common.tensor import _TensorMeta

from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.dtensor.meta import MetaTensor
from mindspore_hyper.dtensor.shape_registry import infer as infer_shapes

__all__ = ["install", "BACKWARD_LISTENERS"]

BACKWARD_LISTENERS: list = []  # called with no argument when a mindspore.grad/value_and_grad backward begins

_ORIGINAL = primitive_module._run_op
_ORIGINAL_TENSOR_CALL = _TensorMeta.__call__
_ORIGINAL_GETITEM = Tensor.__getitem__
_ORIGINAL_SETITEM = Tensor.__setitem__
_ORIGINAL_GRAD_FORWARD = grad_module._pynative_func_grad_forward
_ORIGINAL_GRAD_BACKWARD = grad_module._pynative_func_grad_backward


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


def _holds_meta(values) -> bool:
    """Whether a shape-only tensor (a dry run's MetaTensor) is among `values` or their list members."""
    return any(isinstance(v, MetaTensor) or (isinstance(v, (list, tuple)) and _holds_meta(v)) for v in values)


def _first_dtensor(values):
    """The first DTensor among `values` or inside their list/tuple members, or None."""
    for v in values:
        if isinstance(v, DTensor):
            return v
    return _nested_dtensor(values)


def _guarded_run_op(obj, op_name, args):
    found = _nested_dtensor(args)
    if found is not None:
        return found.execution.dispatch(_PrimitiveCall(op_name), (obj, op_name, tuple(args)), {})
    if _holds_meta(args):
        return infer_shapes(_PrimitiveCall(op_name), (obj, op_name, tuple(args)), {})
    return _ORIGINAL(obj, op_name, args)


def _plain_tensor_fallback(self, func, args, kwargs=None):
    """`__fallback__` of plain Tensors: MindSpore calls it when a plain Tensor is the object of
    an op that has DTensor operands."""
    kwargs = kwargs or {}
    found = _first_dtensor(list(args) + list(kwargs.values()))
    if found is None and _holds_meta(list(args) + list(kwargs.values())):
        return infer_shapes(func, args, kwargs)  # a dry run's shape-only tensor among the operands
    if found is None:
        raise RuntimeError(f"{getattr(func, 'name', func)}: MindSpore asked a plain Tensor to intercept an op "
                           "without DTensor operands (another Tensor subclass with __fallback__ is involved)")
    return found.execution.dispatch(func, args, kwargs)


class _PlainTensorOnly:
    """`Tensor.__fallback__`, visible on instances of exactly `Tensor` only: MindSpore sends
    every op with an operand of a Tensor subclass that has `__fallback__` through it, and
    Parameters (a subclass) must keep their direct path."""

    def __get__(self, obj, owner=None):
        if obj is None or type(obj) is not Tensor:
            raise AttributeError("__fallback__")
        return _plain_tensor_fallback.__get__(obj, owner)


def _tensor_call(cls, *args, **kwargs):
    """`Tensor(...)` that reads a DTensor source by its gathered value."""
    if args and isinstance(args[0], DTensor):
        args = (args[0].full_tensor(),) + args[1:]
    elif isinstance(kwargs.get("input_data"), DTensor):
        kwargs["input_data"] = kwargs["input_data"].full_tensor()
    return _ORIGINAL_TENSOR_CALL(cls, *args, **kwargs)


def _index_dtensor(index):
    return _first_dtensor(index if isinstance(index, tuple) else (index,))


def _getitem(self, index):
    """`Tensor.__getitem__`; a DTensor index makes it an op on DTensors."""
    found = _index_dtensor(index)
    if found is not None and not isinstance(self, DTensor):
        from mindspore_hyper.dtensor.dispatch import dispatch_getitem, replicated_dtensor

        return dispatch_getitem(found.execution, replicated_dtensor(found.execution, self), index)
    if isinstance(self, MetaTensor) or _holds_meta(index if isinstance(index, tuple) else (index,)):
        return infer_shapes(_PrimitiveCall("getitem"), (self, index), {})  # shapes only (a dry run)
    return _ORIGINAL_GETITEM(self, index)


def _setitem(self, index, value):
    """`Tensor.__setitem__`; DTensor indices or values are read by their gathered values."""
    def plain(v):
        return v.full_tensor() if isinstance(v, DTensor) else v

    if isinstance(self, MetaTensor):
        return None  # a dry run writes no values; the shape stays
    if isinstance(value, DTensor) or _index_dtensor(index) is not None:
        index = tuple(plain(i) for i in index) if isinstance(index, tuple) else plain(index)
        value = plain(value)
    return _ORIGINAL_SETITEM(self, index, value)


def _global_value(value):
    if isinstance(value, DTensor):
        if value.layout.is_rank_local:
            raise ValueError("a function differentiated by mindspore.grad/value_and_grad returned a rank-local tensor "
                             "(values that differ per device, from DTensor.to_local()); reduce it first, e.g. "
                             "DTensor.from_local(loss, mesh, [Partial('avg')]).full_tensor()")
        return value.full_tensor()
    if isinstance(value, (tuple, list)):
        return type(value)(_global_value(v) for v in value)
    return value


_GLOBAL_OUTPUTS = weakref.WeakKeyDictionary()  # fn -> the same fn returning global values (stable identity)


def _with_global_outputs(fn):
    try:
        return _GLOBAL_OUTPUTS[fn]
    except (KeyError, TypeError):
        pass

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        return _global_value(fn(*args, **kwargs))

    try:
        _GLOBAL_OUTPUTS[fn] = wrapped
    except TypeError:
        pass
    return wrapped


def _contains_dtensor(value) -> bool:
    if isinstance(value, DTensor):
        return True
    return isinstance(value, (tuple, list)) and any(_contains_dtensor(v) for v in value)


def _grad_forward(fn, *args, **kwargs):
    """MindSpore's PyNative gradient forward, with DTensor outputs differentiable (see module docstring)."""
    from mindspore import nn

    from mindspore_hyper.autodiff import reset_after_failure

    try:
        if not isinstance(fn, nn.Cell):
            return _ORIGINAL_GRAD_FORWARD(_with_global_outputs(fn), *args, **kwargs)
        outputs = _ORIGINAL_GRAD_FORWARD(fn, *args, **kwargs)
    except BaseException:
        reset_after_failure()  # an interrupted forward would leave the executor's graph behind (autodiff.py)
        raise
    if _contains_dtensor(outputs):
        reset_after_failure()
        raise ValueError(f"mindspore.grad/value_and_grad of {type(fn).__name__}: the Cell returned a DTensor, whose "
                         "gradient MindSpore cannot see; return its global value (loss.full_tensor()) from construct, "
                         "differentiate a function that calls the Cell, or use parallelize_value_and_grad")
    return outputs


def _grad_backward(fn, *args):
    """MindSpore's PyNative gradient backward, for the function `_grad_forward` ran."""
    from mindspore import nn

    for listener in list(BACKWARD_LISTENERS):
        listener()
    return _ORIGINAL_GRAD_BACKWARD(fn if isinstance(fn, nn.Cell) else _with_global_outputs(fn), *args)


def install() -> None:
    """Install the routes of the module docstring (idempotent)."""
    for name, module in list(sys.modules.items()):
        if name.startswith("mindspore") and getattr(module, "_run_op", None) is _ORIGINAL:
            module._run_op = _guarded_run_op
    Tensor.__fallback__ = _PlainTensorOnly()
    _TensorMeta.__call__ = _tensor_call
    Tensor.__getitem__ = _getitem
    Tensor.__setitem__ = _setitem
    grad_module._pynative_func_grad_forward = _grad_forward
    grad_module._pynative_func_grad_backward = _grad_backward
