"""Refusal of the training-step options a composed model (pipeline, MPMD) does not support yet:
`max_grad_norm`, `accumulation_steps` and `loss_scale` of `ParallelModel.train_step` are never
silently ignored."""
from __future__ import annotations

from typing import Any

__all__ = ["refuse_unsupported"]


def refuse_unsupported(mode: str, max_grad_norm: Any = None, accumulation_steps: Any = 1, loss_scale: Any = None,
                       accumulation_hint: str = "") -> None:
    """Raise if any of the options is set.

    Args:
        mode: the model kind named in the message, e.g. "pipeline".
        max_grad_norm, accumulation_steps, loss_scale: train_step's keyword arguments.
        accumulation_hint: how this mode gets the same effect, appended to the accumulation message.

    Raises:
        ValueError: naming the option, its value and the mode.
    """
    if max_grad_norm is not None:
        raise ValueError(f"train_step: max_grad_norm={max_grad_norm!r} is not supported by the {mode} model yet "
                         f"(global-norm clipping needs the norm over every stage/group); use a ParallelModel "
                         f"(auto_parallelize without {mode}) or leave max_grad_norm=None")
    if accumulation_steps != 1:
        raise ValueError(f"train_step: accumulation_steps={accumulation_steps!r} is not supported by the {mode} "
                         f"model yet{'; ' + accumulation_hint if accumulation_hint else ''}")
    if loss_scale is not None:
        raise ValueError(f"train_step: loss_scale={loss_scale!r} is not supported by the {mode} model yet; leave "
                         f"loss_scale=None")
