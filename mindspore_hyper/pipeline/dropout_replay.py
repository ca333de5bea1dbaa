"""Dropout masks of a stage's forward, replayed when its backward recomputes that forward.

A stage's backward recomputes its forward (see computation.py). MindSpore's Dropout primitive
keeps its own random state per instance (neither `mindspore.set_seed` nor `set_rng_state`
rewinds it), so a recomputed forward would draw new masks and the gradient would belong to a
forward that never produced the loss. `DropoutReplay` puts a thin callable in place of each
`nn.Dropout`'s primitive: while a microbatch's forward runs it draws masks as usual and keeps
them (in call order); while a recomputation of that microbatch runs it applies the kept masks
(`x * mask / keep_prob`, the primitive's own formula) instead of drawing; otherwise it is the
primitive. Functional `ops.dropout` calls and other random ops are not covered (docs/mpmd.md).
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional

from mindspore import Tensor, nn

__all__ = ["DropoutReplay"]


class _ReplayableDropout:
    """Stands in for one nn.Dropout's primitive; its `owner` (a DropoutReplay) decides whether
    a call draws and records, replays, or just draws."""

    def __init__(self, primitive):
        self.primitive = primitive
        self.keep_prob = float(primitive.keep_prob)
        self.owner: Optional["DropoutReplay"] = None

    def __call__(self, x):
        owner = self.owner
        if owner is None or owner.mode is None:
            return self.primitive(x)
        if owner.mode == "record":
            out, mask = self.primitive(x)
            owner.keep(mask)
            return out, mask
        mask = owner.next_mask(x)
        return x * mask / self.keep_prob, mask


class DropoutReplay:
    """The kept dropout masks of one stage, per microbatch (see module docstring).

    Args:
        cell: the stage's Cell; every nn.Dropout inside it is made replayable (the Dropout Cells
            are the model's own: their primitive is wrapped once and the wrapper rebound to the
            stage that holds it now).
    """

    def __init__(self, cell: nn.Cell):
        self.count = 0
        for _, sub in cell.cells_and_names():
            if isinstance(sub, nn.Dropout):
                wrapper = sub.__dict__.get("dropout")
                if not isinstance(wrapper, _ReplayableDropout):
                    wrapper = _ReplayableDropout(sub.dropout)
                    object.__setattr__(sub, "dropout", wrapper)  # the instance attribute nn.Dropout.construct calls
                wrapper.owner = self
                self.count += 1
        self.mode: Optional[str] = None
        self._masks: Dict[int, List[Tensor]] = {}
        self._current: List[Tensor] = []
        self._position = 0

    @contextmanager
    def recording(self, microbatch: int) -> Iterator[None]:
        """Masks drawn inside are kept for `microbatch` (replacing any kept before)."""
        self._masks[microbatch] = self._current = []
        with self._mode("record"):
            yield

    @contextmanager
    def replaying(self, microbatch: int) -> Iterator[None]:
        """Dropouts inside apply `microbatch`'s kept masks, in the order they were drawn.

        Raises:
            RuntimeError: the recomputation calls dropout more often than the forward did, or
                less (the forward and its recomputation took different paths).
        """
        self._current = self._masks.get(microbatch, [])
        self._position = 0
        with self._mode("replay"):
            yield
        if self._position != len(self._current):
            raise RuntimeError(f"pipeline: the recomputed forward of microbatch {microbatch} called dropout "
                               f"{self._position} times, its forward {len(self._current)} times")

    def next_mask(self, x) -> Tensor:
        if self._position >= len(self._current):
            raise RuntimeError("pipeline: a recomputed stage forward called dropout more often than its forward did")
        mask = self._current[self._position]
        if tuple(mask.shape) != tuple(x.shape):
            raise RuntimeError(f"pipeline: a recomputed stage forward's dropout input has shape {tuple(x.shape)}, "
                               f"the forward's had {tuple(mask.shape)}")
        self._position += 1
        return mask

    def keep(self, mask: Tensor) -> None:
        self._current.append(mask)

    def release(self, microbatch: int) -> None:
        """Forget `microbatch`'s masks (its last recomputation ran)."""
        self._masks.pop(microbatch, None)

    def live_sizes(self) -> Counter:
        """Mask size (bytes) -> count of the kept masks."""
        return Counter(int(m.nbytes) for masks in self._masks.values() for m in masks)

    def reset(self) -> None:
        self._masks.clear()
        self._current = []

    @contextmanager
    def _mode(self, mode: str) -> Iterator[None]:
        self.mode = mode
        try:
            yield
        finally:
            self.mode = None
