"""History-based prediction: an exponential moving average per tracked quantity."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

__all__ = ["LoadHistory", "check_loads"]


def check_loads(name: str, loads: Sequence[float], length: int) -> Tuple[float, ...]:
    """`loads` as floats, or ValueError naming `name` unless it holds `length` finite numbers >= 0."""
    values = tuple(loads)
    if len(values) != length:
        raise ValueError(f"{name}: {len(values)} values given, expected {length}")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name}[{i}]={v!r}: expected a finite number >= 0")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class LoadHistory:
    """EMA of a vector of observations; the first observation seeds it.

    Attributes:
        alpha: weight of the newest observation.
        values: the predictions, or None before the first observation.
        observations: how many observations went in.
    """

    alpha: float
    values: Optional[Tuple[float, ...]] = None
    observations: int = 0

    def observe(self, loads: Sequence[float]) -> "LoadHistory":
        """A new history with `loads` folded in."""
        if self.values is None:
            return LoadHistory(self.alpha, tuple(float(v) for v in loads), 1)
        a = self.alpha
        blended = tuple(a * new + (1 - a) * old for new, old in zip(loads, self.values))
        return LoadHistory(a, blended, self.observations + 1)
