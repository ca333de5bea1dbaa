"""Upstream's `enable_mindspore_backward_compat()` (`hyper_parallel.platform.mindspore.autograd_compat`):
torch-style `loss.backward(gradient)` and `param.grad` on MindSpore PyNative tensors, which
MindFormers 2.0's Trainer trains with.

It patches MindSpore's tensor class, as upstream does: `backward` runs MindSpore's own
`run_backward` from the tensor (every op is recorded for it: the PyNative grad flag is set) and
accumulates each leaf's gradient on it, readable as `.grad` (`is_leaf`, `grad_fn`,
`retain_grad`, `requires_grad` as torch names them). Through this package's DTensors the
gradients are MindSpore autograd's over the dispatched ops, the same graph `value_and_grad`
differentiates: in simulation each global Parameter gets one device's gradient (summed over
the ranks as the layouts say); with fully_shard's `apply_grad_on_fp32_main_grad` the reduced
gradient also lands on `param.main_grad` (`main_grad.py`). Unlike upstream, that policy does not
leave `.grad` None: it holds the same gradient, and `zero_grad()` clears both.

Under msrun (one rank per process) each process's Parameter gets its shard's gradient, reduced
over the ranks as the layouts say, equal to `value_and_grad`'s: the collectives there are
MindSpore custom autograd functions (`comm/process_collectives.py`), which `run_backward`
differentiates. A per-rank simulation's rank simulates its mesh as the simulation does.

`run_backward` cannot run a Cell with a custom `bprop` (MindSpore 2.10 stops with "The
pointer[top_cell_] is null" as the Cell runs in the forward); ring attention, MoE's token
exchange, an `auto_parallelize` model's gradient sum under msrun, the C++ library's simulated
collectives and mpmd's cross-group transfers and timing marks are custom autograd functions as
well. While the patch is on, a Cell with a custom `bprop` (a user's) stops with an error naming it
and the way that works instead (`mindspore.value_and_grad`, which runs them).
`mindspore.value_and_grad` turns MindSpore's grad flag off when it returns; a forward after it
is not recorded, and its `backward()` says so (call `enable_mindspore_backward_compat()` again).
`disable_mindspore_backward_compat()` (not upstream's) restores MindSpore's tensor class.
"""
from __future__ import annotations

from typing import Dict, Optional

from mindspore import nn, ops
from mindspore.common import dtype as mstype
from mindspore._c_expression import TensorPy, run_backward
from mindspore.graph.api import _pynative_executor

from mindspore_hyper.hyper_parallel.step_phases import backward_began

__all__ = ["enable_mindspore_backward_compat", "disable_mindspore_backward_compat", "backward_compat_enabled"]

_SAVED: Dict[str, object] = {}  # the patched names' previous values (absent ones: None), while enabled
_MISSING = object()


def _get_grad(self):
    """The gradient accumulated on this tensor by `backward` (None before one)."""
    return self._grad


def _set_grad(self, value) -> None:
    if value is not None and not isinstance(value, TensorPy):
        raise TypeError(f"Tensor.grad = {type(value).__name__}: expected a Tensor or None")
    self._grad = value


def _requires_grad(self) -> bool:
    return self._requires_grad


def _set_requires_grad(self, value: bool = True) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"Tensor.requires_grad = {value!r}: expected a bool")
    self._requires_grad = value


def _grad_fn(self):
    node = self._grad_node
    return None if node is None or node.is_leaf() else node


def _seed(output, gradient):
    """The gradient `backward` starts from: `gradient` (a Tensor of the output's shape) or, for
    a real scalar output, ones (torch's rule)."""
    if gradient is None:
        if output.size != 1:
            raise RuntimeError(f"backward(): gradient can be implicitly created only for scalar outputs; this "
                               f"output has shape {tuple(output.shape)}: pass gradient=")
        if output.dtype not in mstype.float_type:
            raise RuntimeError(f"backward(): gradient can be implicitly created only for real scalar outputs, "
                               f"got {output.dtype}")
        return ops.ones_like(output)
    if not isinstance(gradient, TensorPy):
        raise TypeError(f"backward(gradient=...): expected a Tensor or None, got {type(gradient).__name__}")
    if tuple(gradient.shape) != tuple(output.shape):
        raise RuntimeError(f"backward(gradient=...): Mismatch in shape: gradient has a shape of "
                           f"{tuple(gradient.shape)} and the output has a shape of {tuple(output.shape)}")
    return gradient


def _backward(self, gradient=None, retain_graph: Optional[bool] = None, create_graph: bool = False, inputs=None):
    """Accumulate d(self)/d(leaf) x gradient on every leaf that requires grad (or on `inputs`)."""
    if isinstance(inputs, TensorPy):
        inputs = (inputs,)
    inputs = () if inputs is None else tuple(inputs)
    seed = _seed(self, gradient)
    if self._grad_node is None and not _pynative_executor.grad_flag():
        raise RuntimeError("backward(): this tensor's forward was not recorded for a backward: MindSpore's grad "
                           "flag is off (mindspore.value_and_grad/grad turn it off when they return); call "
                           "enable_mindspore_backward_compat() again after using them, before the forward")
    backward_began()  # the step's forward ends here (step_phases.py)
    return run_backward((self,), (seed,), create_graph if retain_graph is None else retain_graph,
                        create_graph, inputs, allow_unreachable=True, accumulate_grad=True)


_PATCH = {
    "grad": property(_get_grad, _set_grad),
    "requires_grad": property(_requires_grad, _set_requires_grad),
    "backward": _backward,
    "is_leaf": property(lambda self: self._is_leaf),
    "retains_grad": property(lambda self: self._retains_grad),
    "retain_grad": lambda self: self._retain_grad(),
    "grad_fn": property(_grad_fn),
    "output_nr": property(lambda self: self._output_index),
}


def backward_compat_enabled() -> bool:
    """Whether MindSpore's tensor class is patched."""
    return bool(_SAVED)


def _call_custom_bprop(cell, *args, **kwargs):
    """MindSpore's `Cell._call_custom_bprop`, whose failure outside `value_and_grad` names the Cell."""
    try:
        return _SAVED["__cell_custom_bprop__"](cell, *args, **kwargs)
    except RuntimeError as error:
        if "top_cell_" not in str(error):
            raise
        raise NotImplementedError(
            f"loss.backward() (enable_mindspore_backward_compat) cannot differentiate {type(cell).__name__}, a Cell "
            f"with a custom bprop: MindSpore's run_backward runs a Cell's bprop only inside mindspore.value_and_grad "
            f"(MindSpore 2.10: \"The pointer[top_cell_] is null\"). Take the gradients with "
            f"mindspore.value_and_grad(loss_fn, None, params)(inputs) and pass them to the optimizer") from None


def enable_mindspore_backward_compat() -> None:
    """Give MindSpore tensors torch's `backward()`/`.grad` (module docstring); idempotent, and
    turns MindSpore's grad flag (which `mindspore.value_and_grad` turns off) back on."""
    if _SAVED:
        _pynative_executor.set_grad_flag(True)
        return
    _SAVED["__grad_flag__"] = _pynative_executor.grad_flag()
    _SAVED["__cell_custom_bprop__"] = nn.Cell._call_custom_bprop
    nn.Cell._call_custom_bprop = _call_custom_bprop
    for name, value in _PATCH.items():
        _SAVED[name] = TensorPy.__dict__.get(name, _MISSING)
        setattr(TensorPy, name, value)
    _pynative_executor.set_grad_flag(True)


def disable_mindspore_backward_compat() -> None:
    """Restore MindSpore's tensor class and grad flag as they were before `enable_...`."""
    if not _SAVED:
        return
    _pynative_executor.set_grad_flag(_SAVED.pop("__grad_flag__"))
    nn.Cell._call_custom_bprop = _SAVED.pop("__cell_custom_bprop__")
    for name, value in _SAVED.items():
        if value is _MISSING:
            delattr(TensorPy, name)
        else:
            setattr(TensorPy, name, value)
    _SAVED.clear()
