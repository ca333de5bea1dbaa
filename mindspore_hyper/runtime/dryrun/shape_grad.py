"""`shape_grad`: `mindspore.grad` for a dry run, which has no values to differentiate.

The function runs once as a training forward (the dry-run models inside it hold their
activations and record the backward's collectives, `training_forward`); the gradients returned
are MetaTensors of the shapes and dtypes `mindspore.grad` would return, in its structure.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from mindspore import Tensor

from mindspore_hyper.dtensor.meta import meta

__all__ = ["shape_grad", "training_forward", "in_training_forward"]

_DEPTH = [0]


@contextlib.contextmanager
def training_forward() -> Iterator[None]:
    """Inside the block the dry-run models run training forwards (see `in_training_forward`)."""
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1


def in_training_forward() -> bool:
    """Whether a shape-only gradient is being taken now (the forward's activations are held
    and its backward's collectives recorded)."""
    return _DEPTH[0] > 0


def _like(value):
    if isinstance(value, Tensor):
        return meta(tuple(value.shape), value.dtype, True)
    raise TypeError(f"shape_grad: cannot take the gradient of a {type(value).__name__} input")


def shape_grad(fn: Callable, grad_position=0, weights=None) -> Callable:
    """`mindspore.grad(fn, grad_position, weights)` on shapes (see module docstring).

    Returns:
        A function of `fn`'s inputs returning: the gradient of input `grad_position` (a tuple for
        a tuple of positions) without weights; the weights' gradients (a tuple) with
        `grad_position=None`; (input gradients, weight gradients) with both.
    """
    weights = None if weights is None else tuple(weights)

    def run(*args):
        with training_forward():
            fn(*args)
        inputs = None
        if grad_position is not None:
            inputs = tuple(_like(args[i]) for i in grad_position) if isinstance(grad_position, tuple) \
                else _like(args[grad_position])
        if weights is None:
            return inputs
        weight_grads = tuple(meta(tuple(w.shape), w.dtype, True) for w in weights)
        return weight_grads if inputs is None else (inputs, weight_grads)

    return run
