"""Dynamic rebalancing applied: device moves between data-parallel MPMD groups between steps.

`DeviceRebalancing` feeds each step's measured group times to a `GroupRebalancer` (EMA
prediction, >1.2x / <0.8x mean detection, smallest bottleneck with fewest moves, cool-down) and
applies its plans: a losing group hands its highest ranks to a gaining group and both are laid
out again on their new meshes. Parameters and optimizer states are the global ones in
simulation, so the computation and its numbers do not change.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from mindspore_hyper.mpmd.group_runner import GroupRunner
from mindspore_hyper.schedule.rebalance import GroupRebalancer, GroupSharePlan, RebalancePolicy, ShareMove

MAX_SPLITS = 200_000  # divisible splits examined at most when the planner's split does not divide a batch

__all__ = ["RebalanceRecord", "DeviceRebalancing"]


@dataclass(frozen=True)
class RebalanceRecord:
    """One between-steps decision: the plan, and whether it was applied (and why not)."""

    step: int
    plan: GroupSharePlan
    applied: bool
    note: str = ""


class DeviceRebalancing:
    """Device moves between the `scheduler: dynamic` groups among `runners` (see module docstring).

    Args:
        runners: group name -> GroupRunner (all groups of the model).
        dynamic: names of the groups whose devices may move (at least two).
        policy: thresholds, smoothing, minimum gain and cool-down of the planner.
        optimizer_sharding: whether re-sharded groups split their optimizer states (ZeRO-1).
    """

    def __init__(self, runners: Mapping[str, GroupRunner], dynamic: Sequence[str], policy: RebalancePolicy,
                 optimizer_sharding: bool):
        self.runners = runners
        self.optimizer_sharding = optimizer_sharding
        self.rebalancer = GroupRebalancer(list(dynamic), [runners[n].placement.size for n in dynamic], "devices",
                                          policy)
        self.records: List[RebalanceRecord] = []
        self.last_plan: Optional[GroupSharePlan] = None  # the planner's latest decision (also "no move")

    def step(self, step: int, group_seconds: Mapping[str, float],
             group_batches: Mapping[str, Sequence[int]]) -> Optional[RebalanceRecord]:
        """Observe one step and apply the plan if there is one.

        A group's time is its measured seconds divided by its device count (the simulation runs
        a group's devices one after another). When the planner's split gives a group a device
        count that does not divide a batch it ran, the best split whose counts divide every
        batch (smallest predicted bottleneck, then fewest devices moved) replaces it if it still
        cuts the bottleneck by `min_gain`; otherwise nothing moves and the record says why.

        Args:
            step: the step number (for the record).
            group_seconds: measured seconds of each group's work this step.
            group_batches: the batch sizes each group ran this step.

        Returns:
            The decision when the planner proposed a move, else None.
        """
        names = self.rebalancer.groups
        times = [group_seconds.get(n, 0.0) / self.runners[n].placement.size for n in names]
        if any(t <= 0 for t in times):
            return None
        plan = self.rebalancer.observe(times)
        self.last_plan = plan
        if plan.is_empty:
            return None
        refused = sorted({f"group {n!r} would run batch {b} on {size} devices"
                          for n, size in zip(plan.groups, plan.after) for b in group_batches.get(n, ()) if b % size})
        if refused:
            divisible = self._divisible_plan(plan, group_batches)
            if divisible is None:
                record = RebalanceRecord(step, plan, False, "; ".join(refused) + " (not divisible) and no split "
                                         "with divisible device counts cuts the bottleneck by min_gain")
            else:
                self.apply(divisible)
                self.rebalancer.commit(divisible)
                record = RebalanceRecord(step, divisible, True, "; ".join(refused) + " (not divisible): applied "
                                         f"the best divisible split {list(divisible.after)} instead of "
                                         f"{list(plan.after)}")
        else:
            self.apply(plan)
            self.rebalancer.commit(plan)
            record = RebalanceRecord(step, plan, True)
        self.records.append(record)
        return record

    def _divisible_plan(self, plan: GroupSharePlan, group_batches: Mapping[str, Sequence[int]]
                        ) -> Optional[GroupSharePlan]:
        """The best split whose device counts divide each group's batches, as a plan, or None."""
        costs = self.rebalancer.history.values  # device-seconds of work per group
        total = sum(plan.before)
        options = [[n for n in range(self.rebalancer.min_share, total + 1)
                    if all(b % n == 0 for b in group_batches.get(g, ()))] for g in plan.groups]
        if math.prod(len(o) for o in options) > MAX_SPLITS:
            return None
        best: Optional[Tuple[float, int, Tuple[int, ...]]] = None
        for split in itertools.product(*options):
            if sum(split) != total:
                continue
            bottleneck = max(c / n for c, n in zip(costs, split))
            moved = sum(max(0, b - a) for b, a in zip(plan.before, split))
            key = (round(bottleneck, 12), moved, split)
            if best is None or key < best:
                best = key
        current = max(c / n for c, n in zip(costs, plan.before))
        if best is None or best[2] == plan.before or 1 - best[0] / current < self.rebalancer.policy.min_gain:
            return None
        after = best[2]
        return GroupSharePlan(plan.unit, plan.groups, plan.before, after, _moves(plan.groups, plan.before, after),
                              plan.predicted_before, tuple(c / n for c, n in zip(costs, after)),
                              f"{plan.reason}; with device counts dividing the batches: {list(after)}")

    def apply(self, plan: GroupSharePlan) -> None:
        """Move devices as `plan` says (without consulting or updating the planner).

        Raises:
            ValueError: an unknown group, or a plan made for other group sizes than the current ones.
        """
        apply_device_plan(self.runners, plan, self.optimizer_sharding)


def apply_device_plan(runners: Mapping[str, GroupRunner], plan: GroupSharePlan, optimizer_sharding: bool) -> None:
    """Re-shard the groups of `plan`: a losing group gives up its highest ranks, a gaining group
    takes them, and each changed group is laid out on its new mesh.

    Raises:
        ValueError: an unknown group, or a plan made for other group sizes than the current ones.
    """
    unknown = [n for n in plan.groups if n not in runners]
    if unknown:
        raise ValueError(f"plan.groups: {unknown[0]!r} is not a device group; groups: {list(runners)}")
    plan.validate()
    current = tuple(runners[n].placement.size for n in plan.groups)
    if plan.before != current:
        raise ValueError(f"plan.before={list(plan.before)}: the groups {list(plan.groups)} have {list(current)} "
                         "devices now")
    ranks: Dict[str, List[int]] = {n: list(runners[n].placement.ranks) for n in plan.groups}
    for move in plan.moves:
        given = ranks[move.source][-move.amount:]
        del ranks[move.source][-move.amount:]
        ranks[move.target].extend(given)
    for name in plan.groups:
        runner = runners[name]
        if tuple(sorted(ranks[name])) != runner.placement.ranks:
            runner.build(runner.placement.with_ranks(ranks[name], optimizer_sharding))


def _moves(groups: Sequence[str], before: Sequence[int], after: Sequence[int]) -> Tuple[ShareMove, ...]:
    """Transfers turning `before` into `after`: each losing group gives to the gaining groups in order."""
    losing = [[g, b - a] for g, b, a in zip(groups, before, after) if b > a]
    moves = []
    for g, b, a in zip(groups, before, after):
        need = a - b
        while need > 0:
            source = next(item for item in losing if item[1] > 0)
            amount = min(need, source[1])
            moves.append(ShareMove(source[0], g, amount))
            source[1] -= amount
            need -= amount
    return tuple(moves)
