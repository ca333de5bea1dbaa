"""The end of every model's training step, after the global gradient norm: skip on overflow,
adjust the loss scaler, clip, update. One rule for the SPMD, pipeline and MPMD models."""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

from mindspore_hyper.runtime import loss_scale as scaling
from mindspore_hyper.runtime.grad_clip import scale_to_norm

__all__ = ["guarded_update"]


def guarded_update(model: Any, grads: Sequence, norm: float, scaler: Optional[Any], max_grad_norm: Optional[float],
                   update: Callable[[Sequence], None]) -> bool:
    """Set `model.last_grad_norm` and `model.last_step_skipped`, then, unless the step is skipped,
    run `update` on the gradients (scaled to `max_grad_norm` when their norm exceeds it).

    Args:
        model: the model whose step this is (its two attributes are set).
        grads: the unscaled gradients, in the order `update` takes them.
        norm: their global norm (every element counted once, the same on every process).
        scaler: the step's mindspore.amp loss scaler, or None: with a scaler a non-finite norm
            skips the update (on every process alike, the norm being global) and the scaler is
            adjusted.
        max_grad_norm: the clipping limit, or None.
        update: applies the gradients (the optimizer call).

    Returns:
        Whether the update ran.
    """
    model.last_grad_norm = norm
    model.last_step_skipped = scaler is not None and not math.isfinite(norm)
    if scaler is not None:
        scaling.adjust(scaler, not model.last_step_skipped)
    if model.last_step_skipped:
        return False
    if max_grad_norm is not None:
        grads = tuple(scale_to_norm(grads, norm, max_grad_norm))
    update(grads)
    return True
