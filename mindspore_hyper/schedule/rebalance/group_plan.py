"""A plan that shifts microbatches or devices between MPMD groups.

Shifting microbatches between groups that run the same program on different data keeps the sum
of gradients (hence numerics up to summation order); shifting devices re-shards a group's
tensors without changing what it computes.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence, Tuple, Union

from mindspore_hyper.schedule.errors import ScheduleError

__all__ = ["ShareUnit", "ShareMove", "GroupSharePlan", "check_shares"]


class ShareUnit(str, enum.Enum):
    """What a group's share counts, and how its time depends on it."""

    MICROBATCHES = "microbatches"  # time grows linearly with the share
    DEVICES = "devices"  # time shrinks as 1/share (perfect scaling within the group assumed)


def check_shares(groups: Sequence[str], shares: Sequence[int], unit: Union[str, ShareUnit],
                 min_share: int) -> Tuple[int, ...]:
    """`shares` as a tuple, or ValueError naming the bad argument (unit, min_share, groups, shares)."""
    if unit not in [u.value for u in ShareUnit]:
        raise ValueError(f"unit={unit!r}: expected one of {[u.value for u in ShareUnit]}")
    if isinstance(min_share, bool) or not isinstance(min_share, int) or min_share < 1:
        raise ValueError(f"min_share={min_share!r}: expected an int >= 1")
    split = tuple(shares)
    if len(split) != len(groups) or len(set(groups)) != len(groups) or not groups:
        raise ValueError(f"groups={list(groups)}: expected distinct names, one per share in {list(split)}")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < min_share for n in split):
        raise ValueError(f"shares={list(split)}: expected ints >= min_share={min_share}")
    return split


@dataclass(frozen=True)
class ShareMove:
    """`amount` units leave group `source` for group `target`."""

    source: str
    target: str
    amount: int


@dataclass(frozen=True)
class GroupSharePlan:
    """Shares per group before and after, and the moves between them.

    Attributes:
        unit: microbatches or devices.
        groups: group names, aligned with the tuples below.
        before, after: share of each group.
        moves: unit transfers turning `before` into `after` (empty: no move).
        predicted_before, predicted_after: predicted time per group (seconds).
        reason: why the planner moves or does not.
    """

    unit: ShareUnit
    groups: Tuple[str, ...]
    before: Tuple[int, ...]
    after: Tuple[int, ...]
    moves: Tuple[ShareMove, ...]
    predicted_before: Tuple[float, ...]
    predicted_after: Tuple[float, ...]
    reason: str

    @property
    def is_empty(self) -> bool:
        return not self.moves

    def validate(self, min_share: int = 1) -> None:
        """Raise ScheduleError("plan") unless the moves turn `before` into `after`, keeping the total
        and at least `min_share` per group."""
        if not len(self.groups) == len(self.before) == len(self.after):
            raise ScheduleError("plan", f"{len(self.groups)} groups but {len(self.before)} shares before and "
                                        f"{len(self.after)} after")
        if sum(self.before) != sum(self.after) or min(self.after) < min_share:
            raise ScheduleError("plan", f"{self.unit.value} {list(self.before)} -> {list(self.after)}: the total must "
                                        f"not change and each group keeps at least {min_share}")
        shares = dict(zip(self.groups, self.before))
        for move in self.moves:
            if move.source not in shares or move.target not in shares or move.source == move.target \
                    or move.amount < 1:
                raise ScheduleError("plan", f"{move}: expected a positive amount between two different groups of "
                                            f"{list(self.groups)}")
            shares[move.source] -= move.amount
            shares[move.target] += move.amount
        if tuple(shares[g] for g in self.groups) != self.after:
            raise ScheduleError("plan", f"moves give {[shares[g] for g in self.groups]}, expected {list(self.after)}")
