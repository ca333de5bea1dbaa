"""Step-by-step rebalancing decisions from measured times (the planners' state; never executes).

Each step the runtime reports measured times; the rebalancer folds them into its moving
averages and returns a plan. The runtime applies a non-empty plan between steps and calls
`commit(plan)`; the rebalancer then adopts the new split and stays quiet for
`policy.cooldown_steps` observations.
"""
from __future__ import annotations

from typing import Sequence, Tuple, Union

from mindspore_hyper.schedule.errors import ScheduleError
from mindspore_hyper.schedule.rebalance.group_plan import GroupSharePlan, ShareUnit, check_shares
from mindspore_hyper.schedule.rebalance.group_planner import group_time, plan_group_shares
from mindspore_hyper.schedule.rebalance.history import LoadHistory, check_loads
from mindspore_hyper.schedule.rebalance.policy import RebalancePolicy
from mindspore_hyper.schedule.rebalance.stage_plan import LayerSpec, StageMovePlan, check_layer_counts
from mindspore_hyper.schedule.rebalance.stage_planner import layer_costs_from_stage_times, plan_stage_move

__all__ = ["StageRebalancer", "GroupRebalancer"]

Plan = Union[StageMovePlan, GroupSharePlan]


class _Rebalancer:
    """History, cool-down and commit shared by both rebalancers; subclasses supply the per-item
    costs, the planning, the plan check and the plan that holds still."""

    def __init__(self, split: Tuple[int, ...], policy: RebalancePolicy):
        if not isinstance(policy, RebalancePolicy):
            raise ValueError(f"policy={policy!r}: expected a RebalancePolicy")
        self.policy = policy
        self.split = split
        self.history = LoadHistory(policy.alpha)
        self.cooldown_left = 0

    def observe(self, times: Sequence[float]) -> Plan:
        """Fold in one step's measured times and decide (an empty plan during cool-down)."""
        self.history = self.history.observe(self._per_item_costs(check_loads("times", times, len(self.split))))
        plan = self._plan()
        if self.cooldown_left:
            self.cooldown_left -= 1
            return self._hold(plan, f"cooldown: {self.cooldown_left + 1} step(s) left after the last move")
        return plan

    def commit(self, plan: Plan) -> None:
        """Adopt a plan the runtime applied and start the cool-down (an empty plan changes nothing).

        Raises:
            ScheduleError: the plan is invalid or was made for another split than the current one.
        """
        self._validate(plan)
        if plan.is_empty:
            return
        if plan.before != self.split:
            raise ScheduleError("plan", f"plan starts from {list(plan.before)}, the current split is "
                                        f"{list(self.split)}")
        self.split = plan.after
        self.cooldown_left = self.policy.cooldown_steps

    def _validate(self, plan: Plan) -> None:
        raise NotImplementedError

    def _per_item_costs(self, times: Tuple[float, ...]) -> Tuple[float, ...]:
        raise NotImplementedError

    def _plan(self) -> Plan:
        raise NotImplementedError

    def _hold(self, plan: Plan, reason: str) -> Plan:
        raise NotImplementedError


class StageRebalancer(_Rebalancer):
    """Moves of layers between pipeline stages, from measured stage times.

    A stage's measured time is split among its layers by LayerSpec.weight and each layer's cost
    is averaged (EMA), so a layer keeps its history when it changes stage.

    Args:
        layers: the model's layers in order.
        layer_counts: layers per stage now (each >= 1, summing to len(layers)).
        policy: smoothing, thresholds, minimum gain, cool-down.
    """

    def __init__(self, layers: Sequence[LayerSpec], layer_counts: Sequence[int],
                 policy: RebalancePolicy = RebalancePolicy()):
        super().__init__(check_layer_counts(layer_counts, len(layers)), policy)
        self.layers = tuple(layers)

    @property
    def predicted_layer_costs(self) -> Tuple[float, ...]:
        return self.history.values

    def _validate(self, plan: StageMovePlan) -> None:
        plan.validate()

    def _per_item_costs(self, times: Tuple[float, ...]) -> Tuple[float, ...]:
        return layer_costs_from_stage_times(times, self.split, self.layers)

    def _plan(self) -> StageMovePlan:
        return plan_stage_move(self.history.values, self.layers, self.split, self.policy)

    def _hold(self, plan: StageMovePlan, reason: str) -> StageMovePlan:
        return StageMovePlan(self.split, self.split, (), plan.predicted_before, plan.predicted_before, reason)


class GroupRebalancer(_Rebalancer):
    """Shifts of microbatches or devices between MPMD groups, from measured group times.

    The averaged quantity is the group's cost per unit (seconds per microbatch, or device-seconds
    of work), so a prediction stays valid after the group's share changes.

    Args:
        groups: group names.
        shares: microbatches or devices per group now (each >= min_share).
        unit: "microbatches" or "devices".
        policy: smoothing, thresholds, minimum gain, cool-down.
        min_share: the least a group may keep.
    """

    def __init__(self, groups: Sequence[str], shares: Sequence[int], unit: Union[str, ShareUnit],
                 policy: RebalancePolicy = RebalancePolicy(), min_share: int = 1):
        split = check_shares(groups, shares, unit, min_share)
        super().__init__(split, policy)
        self.groups = tuple(groups)
        self.unit = ShareUnit(unit)
        self.min_share = min_share

    @property
    def predicted_times(self) -> Tuple[float, ...]:
        return tuple(group_time(self.unit, c, n) for c, n in zip(self.history.values, self.split))

    def _validate(self, plan: GroupSharePlan) -> None:
        plan.validate(self.min_share)

    def _per_item_costs(self, times: Tuple[float, ...]) -> Tuple[float, ...]:
        if self.unit is ShareUnit.MICROBATCHES:
            return tuple(t / n for t, n in zip(times, self.split))
        return tuple(t * n for t, n in zip(times, self.split))

    def _plan(self) -> GroupSharePlan:
        return plan_group_shares(self.history.values, self.groups, self.split, self.unit, self.policy, self.min_share)

    def _hold(self, plan: GroupSharePlan, reason: str) -> GroupSharePlan:
        return GroupSharePlan(self.unit, self.groups, self.split, self.split, (), plan.predicted_before,
                              plan.predicted_before, reason)
