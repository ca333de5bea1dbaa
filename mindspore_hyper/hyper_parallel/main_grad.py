"""`param.main_grad`: upstream fully_shard's `apply_grad_on_fp32_main_grad` policy.

With `MixedPrecisionPolicy(apply_grad_on_fp32_main_grad=True)` upstream adds each backward's
reduced gradient of a sharded Parameter (after the reduce-scatter, in the policy's reduce dtype:
float32 for MindFormers' float32 reduction) onto `param.main_grad`, a buffer that gradient
accumulation sums into (Megatron-LM's main_grad), and leaves `param.grad` None; the training loop
reads `main_grad` and clears it after the optimizer step (`zero_grad`).

Here the gradient a backward gives a Parameter (`mindspore.value_and_grad`, or `loss.backward()`
through `enable_mindspore_backward_compat`) is already the reduced one: in simulation the global
Parameter's (every rank's shard of it), under msrun this process's shard after the reduce-scatter.
A gradient hook on the Parameter adds it to `main_grad` (created on the first backward, summed on
the next ones, kept in the gradient's dtype as upstream keeps it); the backward itself still
returns the gradient unchanged, so `value_and_grad` users see the same values either way.
"""
from __future__ import annotations

from typing import Iterable

from mindspore import Parameter, nn, ops

__all__ = ["accumulate_on_main_grad", "clear_main_grads"]


def accumulate_on_main_grad(param: Parameter) -> None:
    """Make every backward add `param`'s gradient to `param.main_grad` (module docstring)."""
    if getattr(param, "_main_grad_hook", None) is not None:
        return

    def add(grad):
        held = getattr(param, "main_grad", None)
        param.main_grad = grad.copy() if held is None else held + grad

    param.main_grad = None
    param._main_grad_hook = param.register_hook(add)


def clear_main_grads(cell: nn.Cell, set_to_none: bool = True) -> None:
    """Clear the `main_grad` of `cell`'s Parameters that accumulate one: None (torch's default
    `set_to_none=True`) or zeros of the same shape and dtype; and their `.grad` (None).

    Args:
        cell: the Cell (its Parameters and its sub-Cells').
        set_to_none: None instead of zeros.
    """
    params: Iterable[Parameter] = cell.get_parameters()
    for param in params:
        param._grad = None  # torch-style `.grad` (autograd_compat.py), as torch's zero_grad clears it
        held = getattr(param, "main_grad", None)
        if getattr(param, "_main_grad_hook", None) is None or held is None:
            continue
        param.main_grad = None if set_to_none else ops.zeros_like(held)
