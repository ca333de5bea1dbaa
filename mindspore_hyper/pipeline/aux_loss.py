"""Auxiliary losses that layers add to the training loss from inside a chain of layers.

A pipeline stage passes one tensor to the next, so a layer's extra loss term (e.g. an MoE
router's load-balancing loss) cannot travel with the activations. Such a layer calls
`add_aux_loss(value)`; whoever runs the layers collects the terms with `AuxLosses` and adds
their sum to the loss: the model's own construct on one device, and each pipeline stage's
computation (`computation.StageComputation`), which adds its stage's terms, scaled like the
microbatch loss, to the objective it differentiates, so each stage's auxiliary loss gets its
gradient in that stage's backward and its value joins the step's loss.
"""
from __future__ import annotations

from typing import List, Optional

from mindspore import Tensor

__all__ = ["AuxLosses", "add_aux_loss"]

_active: List["AuxLosses"] = []


class AuxLosses:
    """Collects the `add_aux_loss` terms of the layers run inside the `with` block."""

    def __init__(self):
        self.values: List[object] = []

    def __enter__(self) -> "AuxLosses":
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.remove(self)

    def __bool__(self) -> bool:
        return bool(self.values)

    def total(self) -> Optional[Tensor]:
        """The sum of the collected terms as a plain (differentiable) Tensor, or None when none
        was added. A term computed on a simulated mesh (a DTensor) counts as its global value."""
        from mindspore_hyper.dtensor import DTensor

        out = None
        for v in self.values:
            v = v.full_tensor() if isinstance(v, DTensor) else v
            out = v if out is None else out + v
        return out


def add_aux_loss(value, layer: str = "a layer") -> None:
    """Hand `value` (a scalar loss term) to the innermost active `AuxLosses`.

    Raises:
        RuntimeError: no `AuxLosses` is active: the term would be dropped silently.
    """
    if not _active:
        raise RuntimeError(f"{layer} adds an auxiliary loss but nothing collects it: run the layers inside "
                           f"`with mindspore_hyper.pipeline.AuxLosses() as aux:` and add aux.total() to "
                           f"the loss (pipeline stages do this themselves)")
    _active[-1].values.append(value)
