"""Gradient accumulation without synchronisation: hsdp's `set_requires_grad_sync(False)` (with
`enable_grad_accumulation=True`) and fully_shard's `set_requires_gradient_sync(False)`.

While synchronisation is off, each backward adds a Cell's Parameter gradients, before their
reduction over the data-parallel ranks, to a running sum per Parameter and per rank, and no
collective runs for them; the first backward with it on reduces that running sum (this
backward's gradient included) once. What a backward returns for the Parameter:
- "running_sum" (hsdp, upstream's `HSDPGradHook` with `requires_acc_grad`): the running sum
  every time: unsynchronised while off (under msrun: this rank's rows of its own sum),
  reduced when on; the sum is kept until `zero_grads()` (with synchronisation on at
  every backward, each returns the reduced sum since `zero_grads()`, as upstream's).
- "deferred" (fully_shard, torch FSDP2's `set_requires_gradient_sync`): zeros while off
  (nothing has reached the sharded gradient yet, so a `.grad` that `loss.backward()` adds up
  stays right), the reduced sum at the first backward with it on, which empties the sum.
The flag is read when the Cell's forward runs (its gathers choose their backward then).

In the one-process simulation (and in each thread of `--per-rank`, which simulates its whole
mesh) the ranks' gradients are not held apart: each Parameter's
gradient is one global value, already the ranks' sum (docs/hyper_parallel.md, "hsdp's and
fully_shard's gradient accumulation"). The running sum there is the synchronised one; the
value after the synchronising backward is the same sum, but what a "running_sum" backward
returns while off is the group's running sum, not any rank's own. The same holds under msrun
for a batch given as DTensors split over the group: its reduction is part of the ops' backward.
"""
from __future__ import annotations

import threading
from typing import Dict, Hashable

from mindspore import Tensor, ops
from mindspore.common import _Function

__all__ = ["GradAccumulation"]

STYLES = ("running_sum", "deferred")


class GradAccumulation:
    """One Cell's unsynchronised gradient sums (module docstring).

    Attributes:
        style: "running_sum" (hsdp) or "deferred" (fully_shard).
        sync: whether the next forward's backward synchronises (the user's flag).
        paused: True while a pipeline schedule runs the Cell (the schedule sums each
            microbatch's synchronised gradient itself: the same values).
    """

    def __init__(self, style: str):
        if style not in STYLES:
            raise ValueError(f"GradAccumulation: style must be one of {list(STYLES)}, got {style!r}")
        self.style = style
        self.sync = True
        self.paused = False
        self._sums: Dict[Hashable, Tensor] = {}
        self._lock = threading.Lock()  # per-rank simulation runs ranks as threads

    def engaged(self) -> bool:
        """Whether the next forward's gathers go through the running sums."""
        if self.paused:
            return False
        return self.style == "running_sum" or not self.sync or bool(self._sums)

    def clear(self) -> None:
        """Drop the running sums (hsdp's `zero_grads()`)."""
        with self._lock:
            self._sums.clear()

    def add(self, value: Tensor, key: Hashable, syncing: bool) -> Tensor:
        """`value` through an identity whose backward adds the gradient to the running sum `key`
        (one Parameter's piece on one rank) and returns what the module docstring says;
        `syncing`: whether the reduction after it runs."""
        return _Accumulate.apply(value, self, key, syncing)

    def backward(self, grad: Tensor, key: Hashable, syncing: bool) -> Tensor:
        """The gradient `_Accumulate` passes on for `grad` (see `add`)."""
        keep = self.style == "running_sum"
        with self._lock:
            held = self._sums.get(key)
            total = grad if held is None else held + grad
            if syncing and not keep:
                self._sums.pop(key, None)
            else:
                self._sums[key] = total
        return total if syncing or keep else ops.zeros_like(grad)


class _Accumulate(_Function):
    """`GradAccumulation.add` as one autograd node (MindSpore's custom autograd function: both
    `mindspore.value_and_grad` and torch-style `loss.backward()` run it; a stateful Python hook
    cannot be an `InsertGradientOf`, which compiles its function)."""

    @staticmethod
    def forward(ctx, x, accumulation, key, syncing):  # pylint: disable=arguments-differ
        ctx.accumulation, ctx.key, ctx.syncing = accumulation, key, syncing
        return x

    @staticmethod
    def backward(ctx, dout):  # pylint: disable=arguments-differ
        return ctx.accumulation.backward(dout, ctx.key, ctx.syncing), None, None, None
