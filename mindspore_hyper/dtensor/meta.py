"""MetaTensor: a tensor that has a shape and a dtype but no values (the dry run's shards).

It is a `mindspore.Tensor` subclass over a lazily initialised placeholder that is never
materialised: every MindSpore op on it arrives at `__fallback__`, which infers the output's
shape and dtype by the op's shape rule (`shape_rules`) instead of running a kernel, and every
read of its values (`asnumpy`, `item`, `float`, a branch on it) raises `DryRunValueError`
naming the script line, since a dry run computes no values.
"""
from __future__ import annotations

import math
from typing import Sequence

from mindspore import Tensor
from mindspore.common.initializer import Zero

from mindspore_hyper.dtensor.shape_registry import infer, user_line

__all__ = ["MetaTensor", "meta", "DryRunValueError"]


class DryRunValueError(RuntimeError):
    """A dry run was asked for a value: it computes shapes, dtypes and bytes only."""


class MetaTensor(Tensor):
    """A shape and dtype without values (see module docstring). Build with `meta`."""

    grad_path: bool  # a trainable parameter reaches it: backward traffic through it is counted
    # the host constant of the model code it stands for (a plain Tensor with values, e.g. a causal
    # mask), None for what the run computes: read only to recognise a mask's diagonal structure
    # (dtensor/context_parallel/diagonal_mask.py), never to compute
    constant = None

    def __fallback__(self, func, args, kwargs=None):
        return infer(func, args, kwargs or {})

    def _refuse(self, what: str):
        line = user_line()
        raise DryRunValueError(
            f"dry run: {what} of a tensor of shape {tuple(self.shape)} {self.dtype} has no value (the dry run computes "
            f"shapes, dtypes and bytes only){' at ' + line if line else ''}; keep value reads out of a dry-run "
            "script, or give a stand-in value with mindspore_hyper.dryrun_mock(value, default)")

    def asnumpy(self):
        self._refuse("asnumpy()")

    def numpy(self):
        self._refuse("numpy()")

    def item(self, *index):
        self._refuse("item()")

    def tolist(self):
        self._refuse("tolist()")

    def __array__(self, dtype=None):
        self._refuse("a NumPy conversion")

    def __bool__(self):
        self._refuse("a truth test (a branch on data)")

    def __float__(self):
        self._refuse("float()")

    def __int__(self):
        self._refuse("int()")

    def __index__(self):
        self._refuse("use as an index")

    def __repr__(self) -> str:
        return f"MetaTensor(shape={tuple(self.shape)}, dtype={self.dtype})"

    __str__ = __repr__

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def meta(shape: Sequence[int], dtype, grad_path: bool = False) -> MetaTensor:
    """A MetaTensor of `shape` and `dtype` (no memory is ever allocated for its values).

    Raises:
        ValueError: a negative dimension.
    """
    shape = tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"dry run: a tensor shape {shape} has a negative dimension")
    placeholder = Tensor(shape=shape, dtype=dtype, init=Zero())
    out = Tensor._make_subclass(MetaTensor, placeholder)
    out.grad_path = grad_path
    return out
