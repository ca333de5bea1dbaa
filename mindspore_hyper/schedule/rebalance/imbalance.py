"""Which stages/groups are overloaded (> overload x mean) or underloaded (< underload x mean)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

__all__ = ["Imbalance", "detect_imbalance"]


@dataclass(frozen=True)
class Imbalance:
    """Loads compared with their mean.

    Attributes:
        mean: mean load.
        ratios: each load over the mean (1.0 for all when every load is 0).
        overloaded: indices with ratio > the overload threshold.
        underloaded: indices with ratio < the underload threshold.
    """

    mean: float
    ratios: Tuple[float, ...]
    overloaded: Tuple[int, ...]
    underloaded: Tuple[int, ...]

    @property
    def balanced(self) -> bool:
        return not self.overloaded and not self.underloaded


def detect_imbalance(loads: Sequence[float], overload: float = 1.2, underload: float = 0.8) -> Imbalance:
    """Classify `loads` (predicted times, >= 0) against their mean.

    Raises:
        ValueError: no loads.
    """
    if not loads:
        raise ValueError("loads: expected at least one value")
    mean = sum(loads) / len(loads)
    ratios = tuple(load / mean if mean > 0 else 1.0 for load in loads)
    return Imbalance(mean, ratios, tuple(i for i, r in enumerate(ratios) if r > overload),
                     tuple(i for i, r in enumerate(ratios) if r < underload))
