"""The value types of attention under context parallelism: the element-wise steps applied to the
scores and the deferred scores' expression (`expression` builds them, `ring` / `ulysses` compute
them)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import numpy as np
from mindspore import ops

__all__ = ["AttentionScores", "Step", "ordinary", "suspended", "MASKED_BELOW"]

# A score at or below this after the mask steps has softmax weight exactly 0 in float32 (exp
# underflows) unless |scores| exceed it: blocks masked this low everywhere are skipped.
MASKED_BELOW = -1e8

_suspended = [0]


def suspended() -> bool:
    """Whether ops run by their own rules now (inside `ordinary`)."""
    return _suspended[0] > 0


@contextlib.contextmanager
def ordinary() -> Iterator[None]:
    """Inside the block ops run by their own rules (no deferral): replays and the Ulysses core."""
    _suspended[0] += 1
    try:
        yield
    finally:
        _suspended[0] -= 1


@dataclass(frozen=True)
class Step:
    """One element-wise step applied to the scores, in order.

    Attributes:
        kind: "mul" / "div" (by `value`), "add" (`mask`), "fill" (positions where the bool
            `mask` is True become `value`).
        value: the number of mul/div/fill.
        mask: the DTensor operand of add/fill (broadcast to the scores' shape).
    """

    kind: str
    value: float = 0.0
    mask: Optional[object] = None  # a DTensor

    def apply(self, scores, mask=None):
        """The step on `scores` (plain Tensors or DTensors) with `mask` (this step's operand or
        its block)."""
        if self.kind == "mul":
            return scores * self.value
        if self.kind == "div":
            return scores / self.value
        if self.kind == "add":
            return scores + mask
        return ops.masked_fill(scores, mask, self.value)

    def grad(self, grad, mask=None):
        """The gradient of the step's input from `grad`, its output's (plain Tensors; `mask` as
        in `apply`). An "add" mask's own gradient is `grad` (reduced to its shape by the ring)."""
        if self.kind == "mul":
            return grad * self.value
        if self.kind == "div":
            return grad / self.value
        if self.kind == "add":
            return grad
        return ops.masked_fill(grad, mask, 0.0)

    def apply_numpy(self, scores: np.ndarray, mask: Optional[np.ndarray]) -> np.ndarray:
        if self.kind == "mul":
            return scores * self.value
        if self.kind == "div":
            return scores / self.value
        if self.kind == "add":
            return scores + mask
        return np.where(mask, np.float32(self.value), scores)


@dataclass(frozen=True)
class AttentionScores:
    """Deferred attention scores: `steps` applied to `q @ key_t`, then a softmax if `softmax`.

    Attributes:
        q: queries [..., t, d].
        key_t: transposed keys [..., d, s].
        steps: the element-wise steps in order.
        softmax: whether a softmax over the last dimension followed.
    """

    q: object  # DTensor
    key_t: object  # DTensor
    steps: Tuple[Step, ...] = ()
    softmax: bool = False

    def then(self, step: Optional[Step] = None, softmax: bool = False) -> "AttentionScores":
        return AttentionScores(self.q, self.key_t, self.steps + ((step,) if step else ()), softmax)
