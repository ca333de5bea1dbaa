"""MindSpore's gradient functions made safe to fail.

An exception raised inside a PyNative `value_and_grad` / `grad` forward (a refusal of ours, a
shape error in the user's model) leaves MindSpore's PyNative executor holding the unfinished
graph; later gradients in the same process can then come out wrong without any error (seen on
MindSpore 2.10: a pipeline trained after such a failure diverged from its reference from the
second step on). Every gradient function the package builds goes through `value_and_grad` /
`grad` here, which reset the executor's state when the call fails, before re-raising.
"""
from __future__ import annotations

import functools
from typing import Callable

import mindspore as ms

from mindspore_hyper import softmax_backward_cache

__all__ = ["value_and_grad", "grad", "reset_after_failure"]


def reset_after_failure() -> None:
    """Drop what MindSpore's PyNative executor kept of an interrupted forward/backward."""
    from mindspore.graph.api import _pynative_executor

    _pynative_executor.set_grad_flag(False)
    _pynative_executor.clear_res()
    softmax_backward_cache.forget()


def _guarded(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BaseException:
            reset_after_failure()
            raise
    return call


def value_and_grad(fn: Callable, grad_position=0, weights=None, has_aux: bool = False) -> Callable:
    """`mindspore.value_and_grad` whose failure leaves no executor state behind."""
    return _guarded(ms.value_and_grad(fn, grad_position, weights, has_aux))


def grad(fn: Callable, grad_position=0, weights=None, has_aux: bool = False) -> Callable:
    """`mindspore.grad` whose failure leaves no executor state behind."""
    return _guarded(ms.grad(fn, grad_position, weights, has_aux))
