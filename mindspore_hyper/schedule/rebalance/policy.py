"""When the rebalancing planner acts: smoothing, thresholds, minimum gain and cool-down."""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RebalancePolicy"]


@dataclass(frozen=True)
class RebalancePolicy:
    """The planner's knobs.

    Attributes:
        alpha: weight of the newest observation in the exponential moving average
            (prediction = alpha * observed + (1 - alpha) * previous prediction); 0.3 keeps about
            the last three steps and damps +-30% step noise to about +-10%.
        overload: a stage/group whose predicted time exceeds overload x mean is overloaded.
        underload: one below underload x mean is underloaded. The planner only looks for a
            move when some load is outside [underload, overload] x mean.
        min_gain: a move must cut the predicted bottleneck (the largest predicted time) by at
            least this fraction; two splits that are about as good never alternate.
        cooldown_steps: observations after a committed move during which no new move is planned
            (moving parameters and optimizer states is not free).
    """

    alpha: float = 0.3
    overload: float = 1.2
    underload: float = 0.8
    min_gain: float = 0.05
    cooldown_steps: int = 2

    def __post_init__(self):
        checks = (("alpha", 0 < self.alpha <= 1, "in (0, 1]"),
                  ("overload", self.overload > 1, "> 1"),
                  ("underload", 0 <= self.underload < 1, "in [0, 1)"),
                  ("min_gain", 0 <= self.min_gain < 1, "in [0, 1)"))
        for name, ok, expected in checks:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok:
                raise ValueError(f"RebalancePolicy.{name}={value!r}: expected a number {expected}")
        steps = self.cooldown_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"RebalancePolicy.cooldown_steps={steps!r}: expected an int >= 0")
