"""torch.autograd.Function subclasses with their own backward: found at conversion, their gradient checked.

The converted Cell differentiates the traced forward of such a Function; torch runs its hand-written
backward. The two agree when that backward is the exact gradient (a memory-saving rewrite) and differ when it
is not (a straight-through estimator, YOSO's `YosoCumulation`): training would then change silently. So the
conversion runs torch once with `Function.apply` recorded, and when a Function with its own backward ran it
compares the gradients of both models (inputs and parameters) and refuses a difference unless told to accept.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np
import torch
import torch.utils._pytree as pytree
import mindspore as ms
from mindspore import Tensor, nn

from mindspore_hyper.migrate.compare import (check_tolerance, preserved_cell_state, relative_error, to_mindspore,
                                             torch_outputs)
from mindspore_hyper.migrate.errors import CustomBackwardError, TraceFailedError
from mindspore_hyper.migrate.lowering import preserved_buffers, type_name
from mindspore_hyper.migrate.state_dict import StateDictReport, cell_parameters

__all__ = ["CUSTOM_BACKWARD", "FunctionCall", "find_custom_functions", "check_custom_backward"]

CUSTOM_BACKWARD = ("check", "differentiate")
"""check: compare gradients and refuse a difference (default); differentiate: accept the Cell differentiating
the Function's forward (the difference is still measured and reported)."""

# A tensor whose gradient is far below the largest is measured against this fraction of the largest: its
# entries' rounding comes from terms at the global scale, so its own scale would count rounding as error.
SCALE_FLOOR = 1e-3


@dataclass(frozen=True)
class FunctionCall:
    """One torch.autograd.Function subclass with its own backward that the forward ran."""

    name: str  # the class, as reports print it
    module: str  # the innermost module path running it ("" for the root)


def find_custom_functions(torch_module: torch.nn.Module, args: Sequence[Any],
                          kwargs: Dict[str, Any]) -> List[FunctionCall]:
    """Run `torch_module` once (no gradient, buffers restored) with `Function.apply` recorded.

    Returns:
        Each distinct (Function class, module path) whose class defines its own backward, in call order.

    Raises:
        TraceFailedError: torch itself fails on the example inputs (its first error line).
    """
    calls: List[FunctionCall] = []
    try:
        with torch.random.fork_rng(), _recorded_apply(torch_module, calls), torch.no_grad(), \
                preserved_buffers(torch_module):  # the caller's random stream as if this run had not happened
            torch_module(*args, **kwargs)
    except Exception as exc:  # the user's forward may raise anything
        lines = str(exc).strip().splitlines()
        raise TraceFailedError(f"torch cannot run {type_name(type(torch_module))} on the example inputs: "
                               f"{type(exc).__name__}: {lines[0] if lines else ''}") from exc
    return list(dict.fromkeys(calls))


@contextlib.contextmanager
def _recorded_apply(torch_module: torch.nn.Module, calls: List[FunctionCall]) -> Iterator[None]:
    """`Function.apply` wrapped to append to `calls`, and hooks keeping the current module path; both undone
    on exit, whatever the forward raised."""
    stack: List[str] = []
    original = torch.autograd.function.Function.__dict__["apply"]

    def apply(cls, *a, **k):
        base = torch.autograd.Function
        if cls.backward is not base.backward or cls.vjp is not base.vjp:  # `vjp` is backward's other name
            calls.append(FunctionCall(type_name(cls), stack[-1] if stack else ""))
        return original.__get__(None, cls)(*a, **k)

    def enter(path):
        def hook(module, inputs) -> None:
            stack.append(path)
        return hook

    def leave(module, inputs, output) -> None:  # returns None: the output is kept
        stack.pop()

    handles = []
    for path, module in torch_module.named_modules():
        handles.append(module.register_forward_pre_hook(enter(path)))
        handles.append(module.register_forward_hook(leave, always_call=True))
    torch.autograd.function.Function.apply = classmethod(apply)
    try:
        yield
    finally:
        torch.autograd.function.Function.apply = original
        for handle in handles:
            handle.remove()


def check_custom_backward(torch_module: torch.nn.Module, cell: nn.Cell, torch_args: Sequence[Any],
                          torch_kwargs: Dict[str, Any], cell_inputs: Sequence[Any], weights: StateDictReport,
                          functions: Sequence[FunctionCall], mode: str) -> Dict[str, str]:
    """Compare torch's gradients (its Functions' backward) with the Cell's (its forward differentiated).

    The scalar is sum over floating outputs of (output * a fixed random tensor); gradients with respect to the
    floating inputs and every trainable parameter placed one to one (same number of elements) are compared. In
    training mode with dropout (two torch runs differ) both run in eval mode.

    Args:
        torch_module: the torch model (its modes and buffers restored afterwards).
        cell: its conversion (its mode and non-trainable parameters restored afterwards).
        torch_args: the forward's positional inputs.
        torch_kwargs: the forward's keyword inputs.
        cell_inputs: the same tensors in the Cell's order.
        weights: the state-dict report (torch name -> Cell parameter).
        functions: what find_custom_functions found (not empty).
        mode: one of CUSTOM_BACKWARD.

    Returns:
        Function class -> "gradient checked: equal (...)" or, with mode="differentiate", the accepted difference.

    Raises:
        CustomBackwardError: the gradients differ beyond the tolerance and mode is "check".
    """
    with torch.random.fork_rng():  # the caller's random stream as if these runs had not happened
        return _check(torch_module, cell, torch_args, torch_kwargs, cell_inputs, weights, functions, mode)


def _check(torch_module, cell, torch_args, torch_kwargs, cell_inputs, weights, functions, mode) -> Dict[str, str]:
    """check_custom_backward's work, inside its saved random stream."""
    modes = [(m, m.training) for m in torch_module.modules()]
    note = ""
    with torch.no_grad(), preserved_buffers(torch_module):
        runs = [torch_outputs(torch_module(*torch_args, **torch_kwargs)) for _ in range(2)]
    if relative_error(runs[1], runs[0]) != 0.0:
        torch_module.eval()
        cell.set_train(False)
        note = ", in eval mode (dropout makes training mode non-deterministic)"
    try:
        unchecked = _absent_in_eval(torch_module, torch_args, torch_kwargs, functions) if note else []
        paired = _paired(torch_module, weights, cell_parameters(cell))
        try:
            want, names, factors = _torch_gradients(torch_module, torch_args, torch_kwargs, cell_inputs, paired)
            with_inputs = True
        except RuntimeError as exc:  # the forward sets requires_grad on a view of its input (SEW-D's extractor)
            if "requires_grad flags of leaf variables" not in str(exc):
                raise
            want, names, factors = _torch_gradients(torch_module, torch_args, torch_kwargs, cell_inputs, paired,
                                                    with_inputs=False)
            with_inputs = False
            note += ", parameters only (the forward sets requires_grad on a view of its input)"
        got = _cell_gradients(cell, cell_inputs, factors, paired, with_inputs)
    finally:
        for module, training in modes:
            module.training = training
        cell.set_train(torch_module.training)
    if unchecked and mode == "check":
        raise CustomBackwardError(
            f"{', '.join(unchecked)}: torch.autograd.Function with its own backward that runs only in training "
            "mode, where dropout makes torch's runs differ, so its gradient cannot be compared with the "
            "converted Cell's (which differentiates the Function's forward). Pass custom_backward='differentiate' "
            "(CLI: --custom-backward differentiate) to accept it unchecked, or convert with dropout set to 0.")
    tolerance = check_tolerance(torch_module)
    error, worst = _worst(got, want, names)
    where = ", ".join(_where(f) for f in functions)
    measured = f"max relative gradient difference {error:.3g} (tolerance {tolerance:.1g}; worst: {worst}{note})"
    skipped = "not checked (runs only in training mode, where dropout makes torch's runs differ), accepted"
    if error <= tolerance:
        return {f.name: skipped if _where(f) in unchecked else f"gradient checked: equal, {measured}"
                for f in functions}
    if mode == "check":
        raise CustomBackwardError(
            f"{where}: torch.autograd.Function with its own backward, which is not the gradient of its forward: "
            f"the converted Cell's gradients differ from torch's, {measured}. The Cell differentiates the "
            "Function's forward instead of running its backward, so training would differ from torch. Pass "
            "custom_backward='differentiate' (CLI: --custom-backward differentiate) to accept that.")
    return {f.name: skipped if _where(f) in unchecked else
            f"gradient differs, accepted (custom_backward='differentiate': the Cell differentiates the forward): "
            f"{measured}" for f in functions}


def _where(function: FunctionCall) -> str:
    """`Class at 'module.path'` (or `at the root`), as the messages name a Function."""
    return f"{function.name} at {function.module!r}" if function.module else f"{function.name} at the root"


def _absent_in_eval(torch_module, torch_args, torch_kwargs, functions: Sequence[FunctionCall]) -> List[str]:
    """The Functions (as _where names them) that training mode ran and eval mode (the module already switched)
    does not: an eval-mode comparison says nothing about them."""
    in_eval = set(find_custom_functions(torch_module, torch_args, torch_kwargs))
    return [_where(f) for f in functions if f not in in_eval]


def _paired(torch_module: torch.nn.Module, weights: StateDictReport,
            cell_params: Dict[str, ms.Parameter]) -> List[Tuple[str, str]]:
    """(torch name, Cell name) of each trainable parameter placed one to one (same number of elements, a
    trainable Cell parameter): relaid ones (MoE experts stacked into one) are not compared."""
    cell_of = {p.torch_name: p.cell_name for p in weights.placed}
    return [(name, cell_of[name]) for name, p in torch_module.named_parameters() if p.requires_grad
            and name in cell_of and cell_of[name] in cell_params and cell_params[cell_of[name]].requires_grad
            and cell_params[cell_of[name]].size == p.numel()]


def _torch_gradients(torch_module, torch_args, torch_kwargs, cell_inputs, paired, with_inputs: bool = True):
    """(gradients, their names, the output factors): torch's backward, its Functions' backward included; the
    floating inputs' gradients first unless `with_inputs` is False."""
    clones = {id(x): x.detach().clone().requires_grad_(True) for x in cell_inputs
              if with_inputs and isinstance(x, torch.Tensor) and x.dtype.is_floating_point}

    def swap(x):
        return clones.get(id(x), x) if isinstance(x, torch.Tensor) else x

    params = dict(torch_module.named_parameters())
    with preserved_buffers(torch_module):
        out = torch_module(*[swap(x) for x in torch_args], **{k: swap(v) for k, v in torch_kwargs.items()})
        leaves = [leaf for leaf in pytree.tree_flatten(out)[0] if isinstance(leaf, torch.Tensor)]
        rng = np.random.RandomState(0)
        factors = [rng.standard_normal(tuple(leaf.shape)) if leaf.dtype.is_floating_point else None
                   for leaf in leaves]
        total = sum((leaf * torch.tensor(f, dtype=leaf.dtype)).sum() for leaf, f in zip(leaves, factors)
                    if f is not None)
        wrt = [clones[id(x)] for x in cell_inputs if id(x) in clones] + [params[t] for t, _ in paired]
        grads = torch.autograd.grad(total, wrt, allow_unused=True)
    names = [f"input {i}" for i, x in enumerate(cell_inputs) if id(x) in clones]
    names += [f"parameter {t!r}" for t, _ in paired]
    want = [np.zeros(tuple(w.shape)) if g is None else g.detach().double().numpy() for g, w in zip(grads, wrt)]
    return want, names, factors


def _cell_gradients(cell: nn.Cell, cell_inputs, factors, paired, with_inputs: bool = True) -> List[np.ndarray]:
    """The Cell's gradients of the same scalar (its forward differentiated), in _torch_gradients' order."""
    positions = tuple(i for i, x in enumerate(cell_inputs)
                      if with_inputs and isinstance(x, torch.Tensor) and x.dtype.is_floating_point)
    cell_params = cell_parameters(cell)
    params = [cell_params[c] for _, c in paired]

    def scalar(*inputs):
        out = cell(*inputs)
        total = 0
        for leaf, f in zip(out if isinstance(out, (tuple, list)) else (out,), factors):
            if f is not None:
                total = total + (leaf * Tensor(f, dtype=leaf.dtype)).sum()
        return total

    with preserved_cell_state(cell):
        grad = ms.grad(scalar, grad_position=positions or None, weights=params)
        result = grad(*[to_mindspore(x) for x in cell_inputs])
    if positions:
        input_grads, param_grads = result
        input_grads = input_grads if isinstance(input_grads, (tuple, list)) else (input_grads,)
    else:
        input_grads, param_grads = (), result
    got = [g.asnumpy().astype(np.float64) for g in list(input_grads) + list(param_grads)]
    return got


def _worst(got: List[np.ndarray], want: List[np.ndarray], names: List[str]) -> Tuple[float, str]:
    """The largest per-tensor relative difference (see SCALE_FLOOR) and the tensor's name."""
    largest = max([float(np.abs(w).max()) for w in want if w.size] + [1e-30])
    worst, where = 0.0, "none"
    for g, w, name in zip(got, want, names):
        g = g.reshape(w.shape) if g.size == w.size else g
        if g.shape != w.shape:
            raise ValueError(f"gradient of {name}: shape {g.shape}, torch's {w.shape}")
        if not w.size:
            continue
        error = float(np.abs(g - w).max()) / max(float(np.abs(w).max()), SCALE_FLOOR * largest)
        if error > worst or where == "none":
            worst, where = error, name
    return worst, where
