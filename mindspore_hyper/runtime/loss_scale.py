"""Loss scaling for float16 training, with MindSpore's own loss scalers.

`ParallelModel.train_step(..., loss_scale=s)`: the loss is multiplied by the scaler's
`scale_value` before the backward, the gradients (after their synchronisation) divided by it; if a
gradient element anywhere on the mesh is not finite (inf/nan: the scaled float16 backward
overflowed) the optimizer update is skipped on every process (they agree through the global
gradient norm, one all-reduce under msrun) and `scaler.adjust(finite)` runs as
`mindspore.amp`'s training loops call it (a `DynamicLossScaler` then divides its scale by
`scale_factor`, or multiplies it after `scale_window` finite steps).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import mindspore as ms
from mindspore import Tensor
from mindspore.amp import LossScaler, StaticLossScaler

__all__ = ["as_loss_scaler", "scale_value", "unscale", "adjust"]


def as_loss_scaler(loss_scale: Any) -> Optional[LossScaler]:
    """A `mindspore.amp` LossScaler for `loss_scale`: None, a LossScaler (e.g.
    `amp.StaticLossScaler(2**12)`, `amp.DynamicLossScaler(2**16, 2, 1000)`), or a number >= 1
    (a static scale).

    Raises:
        ValueError: naming `loss_scale` and what is accepted.
    """
    if loss_scale is None or isinstance(loss_scale, LossScaler):
        return loss_scale
    if isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool) and math.isfinite(loss_scale) \
            and loss_scale >= 1:
        return StaticLossScaler(float(loss_scale))
    raise ValueError(f"loss_scale={loss_scale!r}: expected None, a number >= 1, or a mindspore.amp loss scaler "
                     f"(amp.StaticLossScaler(scale_value) or amp.DynamicLossScaler(scale_value, scale_factor, "
                     f"scale_window))")


def scale_value(scaler: LossScaler) -> float:
    """The scaler's current scale."""
    return float(scaler.scale_value.asnumpy())


def unscale(grad: Tensor, value: float) -> Tensor:
    """`grad / value` (as `scaler.unscale`: times the reciprocal), computed in float32 for a
    narrower gradient, whose dtype cannot hold the reciprocal of a large scale (2**-25 is 0 in
    float16), and cast back."""
    if grad.dtype == ms.float32 or grad.dtype == ms.float64:
        return grad * Tensor(1.0 / value, grad.dtype)
    return (grad.astype(ms.float32) * Tensor(1.0 / value, ms.float32)).astype(grad.dtype)


def adjust(scaler: LossScaler, finite: bool) -> None:
    """Tell the scaler whether this step's gradients were finite (it updates its scale)."""
    scaler.adjust(Tensor(bool(finite), ms.bool_))
