"""Dynamic rebalancing under msrun: microbatch-share moves between MPMD groups between steps.

No process changes group: each `scheduler: dynamic` group computes a share of the batch's rows
of the work any group can do (in RLHF, the frozen roles' scoring), and the shares change between
steps. Every process must apply the same plan, so the plan is derived from measured times that
every process holds: each process's seconds are all-gathered (`gather_group_seconds`, a group's
time is its slowest member's), and the `GroupRebalancer` (unit microbatches: EMA of each group's
seconds per row, > 1.2x / < 0.8x mean detection, smallest bottleneck with fewest rows moved, 5%
minimum gain, cool-down) is a deterministic function of them.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mindspore_hyper.mpmd.rebalancing import RebalanceRecord
from mindspore_hyper.schedule.rebalance import GroupRebalancer, GroupSharePlan, RebalancePolicy

__all__ = ["ShareRebalancing", "gather_group_seconds", "proportional_shares"]


def proportional_shares(total: int, sizes: Sequence[int]) -> Tuple[int, ...]:
    """`total` rows split in proportion to `sizes` (largest remainders), at least one each.

    Raises:
        ValueError: fewer rows than groups.
    """
    if total < len(sizes):
        raise ValueError(f"a batch of {total} rows cannot give each of {len(sizes)} dynamic groups a row")
    spare = total - len(sizes)
    exact = [spare * s / sum(sizes) for s in sizes]
    shares = [1 + int(np.floor(e)) for e in exact]
    for i in sorted(range(len(sizes)), key=lambda i: exact[i] - np.floor(exact[i]), reverse=True)[:total - sum(shares)]:
        shares[i] += 1
    return tuple(shares)


def gather_group_seconds(local_seconds: float, group_ranks: Mapping[str, Sequence[int]], size: int
                         ) -> Dict[str, float]:
    """Each group's seconds (its slowest member's) from every process's `local_seconds`; a
    collective of all `size` processes, the same result in each."""
    from mindspore_hyper.runtime.distributed.world import world

    everyone = world().communicator(tuple(range(size))).all_gather(np.array([local_seconds], np.float64))
    return {name: float(max(everyone[r] for r in ranks)) for name, ranks in group_ranks.items()}


class ShareRebalancing:
    """Row shares of the `groups` and the planner deciding their moves (see module docstring).

    Args:
        groups: the dynamic groups' names (at least two), in config order.
        shares: rows per group now (each >= 1).
        policy: the planner's thresholds, smoothing, minimum gain and cool-down.

    Raises:
        ValueError: fewer than two groups, or bad shares (named by the planner).
    """

    def __init__(self, groups: Sequence[str], shares: Sequence[int], policy: RebalancePolicy = RebalancePolicy()):
        if len(groups) < 2:
            raise ValueError(f"groups={list(groups)}: microbatch shares move between at least two dynamic groups")
        self.rebalancer = GroupRebalancer(list(groups), list(shares), "microbatches", policy)
        self.records: List[RebalanceRecord] = []
        self.history: List[Tuple[int, ...]] = [self.shares]  # the shares of every step so far, then the next

    @property
    def groups(self) -> Tuple[str, ...]:
        return self.rebalancer.groups

    @property
    def shares(self) -> Tuple[int, ...]:
        return tuple(self.rebalancer.split)

    @property
    def total(self) -> int:
        return sum(self.shares)

    def rows(self) -> Dict[str, slice]:
        """Group -> its rows of the batch (consecutive blocks in group order)."""
        out, start = {}, 0
        for name, share in zip(self.groups, self.shares):
            out[name] = slice(start, start + share)
            start += share
        return out

    def step(self, step: int, group_seconds: Mapping[str, float]) -> Optional[RebalanceRecord]:
        """Observe one step's group seconds (the same in every process) and apply the plan, if any.

        Returns:
            The decision when the planner proposed a move, else None.
        """
        times = [group_seconds[n] for n in self.groups]
        record = None
        if all(t > 0 for t in times):
            plan = self.rebalancer.observe(times)
            if not plan.is_empty:
                self.rebalancer.commit(plan)
                record = RebalanceRecord(step, plan, True)
                self.records.append(record)
        self.history.append(self.shares)
        return record

    def apply(self, plan: GroupSharePlan, step: int) -> RebalanceRecord:
        """Apply a hand-made plan (every process must apply the same one before the same step).

        Raises:
            ScheduleError: a plan for other groups or shares than the current ones, or an invalid plan.
        """
        if tuple(plan.groups) != self.groups:
            raise ValueError(f"plan.groups={list(plan.groups)}: the dynamic groups are {list(self.groups)}")
        self.rebalancer.commit(plan)
        record = RebalanceRecord(step, plan, True, "applied by hand")
        self.records.append(record)
        self.history[-1] = self.shares
        return record
