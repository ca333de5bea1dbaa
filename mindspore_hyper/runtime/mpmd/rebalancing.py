"""Dynamic rebalancing applied: device moves between data-parallel MPMD groups between steps.

`DeviceRebalancing` feeds each step's measured group times to a `GroupRebalancer` (EMA
prediction, >1.2x / <0.8x mean detection, smallest bottleneck with fewest moves, cool-down) and
applies its plans: a losing group hands its highest ranks to a gaining group and both are laid
out again on their new meshes. Parameters and optimizer states are the global ones in
simulation, so the computation and its numbers do not change.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from mindspore_hyper.runtime.mpmd.group_runner import GroupRunner
from mindspore_hyper.schedule.rebalance import GroupRebalancer, GroupSharePlan, RebalancePolicy

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

    def step(self, step: int, group_seconds: Mapping[str, float],
             group_batches: Mapping[str, Sequence[int]]) -> Optional[RebalanceRecord]:
        """Observe one step and apply the plan if there is one.

        A group's time is its measured seconds divided by its device count (the simulation runs
        a group's devices one after another). A plan whose new device count does not divide a
        batch the group ran is not applied; the record says why.

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
        if plan.is_empty:
            return None
        refused = sorted({f"group {n!r} would run batch {b} on {size} devices"
                          for n, size in zip(plan.groups, plan.after) for b in group_batches.get(n, ()) if b % size})
        if refused:
            record = RebalanceRecord(step, plan, False, "; ".join(refused) + " (not divisible)")
        else:
            self.apply(plan)
            self.rebalancer.commit(plan)
            record = RebalanceRecord(step, plan, True)
        self.records.append(record)
        return record

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
