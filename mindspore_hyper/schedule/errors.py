"""The error a schedule or plan that breaks a rule raises."""
from __future__ import annotations

from typing import Optional, Tuple

__all__ = ["ScheduleError"]


class ScheduleError(ValueError):
    """A schedule breaks one of `validate_schedule`'s rules.

    Args:
        rule: which rule: "shape", "placement", "count", "order", "pairing" or "deadlock".
        message: what is wrong, naming ranks, positions in the rank's list and actions.
        cycle: for "deadlock", the (rank, index, action text) of each rank on the wait cycle.
    """

    def __init__(self, rule: str, message: str, cycle: Optional[Tuple[Tuple[int, int, str], ...]] = None):
        self.rule = rule
        self.cycle = cycle
        super().__init__(f"[{rule}] {message}")
