"""Plan group shares: the integer split with the smallest predicted bottleneck, reached with fewest moves."""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple, Union

from mindspore_hyper.schedule.rebalance.group_plan import GroupSharePlan, ShareMove, ShareUnit, check_shares
from mindspore_hyper.schedule.rebalance.history import check_loads
from mindspore_hyper.schedule.rebalance.imbalance import detect_imbalance
from mindspore_hyper.schedule.rebalance.policy import RebalancePolicy

__all__ = ["plan_group_shares", "group_time"]

_TOLERANCE = 1e-9


def group_time(unit: ShareUnit, unit_cost: float, share: int) -> float:
    """Predicted time of a group: cost per microbatch x microbatches, or work / devices."""
    return unit_cost * share if unit is ShareUnit.MICROBATCHES else unit_cost / share


def plan_group_shares(unit_costs: Sequence[float], groups: Sequence[str], shares: Sequence[int],
                      unit: Union[str, ShareUnit],
                      policy: RebalancePolicy = RebalancePolicy(), min_share: int = 1) -> GroupSharePlan:
    """Decide whether and how to shift microbatches or devices between groups (never moves anything).

    When some group is outside [underload, overload] x mean, find the smallest achievable
    bottleneck over all integer splits of the same total (each group >= min_share), then the
    split reaching it that moves the fewest units; keep it only if it cuts the bottleneck by at
    least min_gain.

    Args:
        unit_costs: per group, predicted seconds per microbatch (MICROBATCHES) or predicted
            work in device-seconds (DEVICES).
        groups: group names.
        shares: current microbatches or devices per group.
        unit: what the shares count ("microbatches" or "devices").
        policy: thresholds and minimum gain.
        min_share: the least a group may keep.

    Returns:
        A GroupSharePlan; `moves` is empty when nothing should move, and `reason` says why.

    Raises:
        ValueError: a bad unit, min_share, group list, share or unit cost (naming it).
    """
    before = check_shares(groups, shares, unit, min_share)
    unit = ShareUnit(unit)
    unit_costs = check_loads("unit_costs", unit_costs, len(before))
    predicted = tuple(group_time(unit, c, n) for c, n in zip(unit_costs, before))
    imbalance = detect_imbalance(predicted, policy.overload, policy.underload)
    if imbalance.balanced:
        return GroupSharePlan(unit, tuple(groups), before, before, (), predicted, predicted,
                              f"balanced: every group within [{policy.underload}, {policy.overload}] x mean")
    best = _smallest_bottleneck(unit, unit_costs, sum(before), min_share)
    after = _closest_split(unit, unit_costs, before, best, min_share)
    predicted_after = tuple(group_time(unit, c, n) for c, n in zip(unit_costs, after))
    gain = 1 - max(predicted_after) / max(predicted)
    flagged = ", ".join(f"{groups[i]} at {imbalance.ratios[i]:.2f} x mean"
                        for i in imbalance.overloaded + imbalance.underloaded)
    if gain < policy.min_gain:
        return GroupSharePlan(unit, tuple(groups), before, before, (), predicted, predicted,
                              f"{flagged}, but the best split cuts the bottleneck by {gain:.1%} "
                              f"(< min_gain {policy.min_gain:.0%})")
    moves = _moves(tuple(groups), before, after)
    return GroupSharePlan(unit, tuple(groups), before, after, moves, predicted, predicted_after,
                          f"{flagged}: moving {sum(m.amount for m in moves)} {unit.value} cuts the bottleneck by "
                          f"{gain:.1%}")


def _smallest_bottleneck(unit: ShareUnit, costs: Sequence[float], total: int, min_share: int) -> float:
    """Hand out units one at a time to where they lower the bottleneck most (optimal for min-max)."""
    shares = [min_share] * len(costs)
    for _ in range(total - min_share * len(costs)):
        if unit is ShareUnit.MICROBATCHES:
            pick = min(range(len(costs)), key=lambda g: group_time(unit, costs[g], shares[g] + 1))
        else:
            pick = max(range(len(costs)), key=lambda g: group_time(unit, costs[g], shares[g]))
        shares[pick] += 1
    return max(group_time(unit, c, n) for c, n in zip(costs, shares))


def _closest_split(unit: ShareUnit, costs: Sequence[float], before: Tuple[int, ...], limit: float,
                   min_share: int) -> Tuple[int, ...]:
    """Clip each share into the range that keeps its time <= limit, then restore the total by
    changing only groups with room, the least loaded first."""
    bound = limit * (1 + _TOLERANCE) + _TOLERANCE
    total = sum(before)
    low: List[int] = []
    high: List[int] = []
    for cost in costs:
        if unit is ShareUnit.MICROBATCHES:
            low.append(min_share)
            high.append(total if cost == 0 else max(min_share, math.floor(bound / cost)))
        else:
            low.append(max(min_share, math.ceil(cost / bound - _TOLERANCE)))
            high.append(total)
    shares = [min(max(n, lo), hi) for n, lo, hi in zip(before, low, high)]
    order = sorted(range(len(costs)), key=lambda g: group_time(unit, costs[g], shares[g]))
    for g in order:
        gap = total - sum(shares)
        if gap > 0:
            shares[g] += min(gap, high[g] - shares[g])
        elif gap < 0:
            shares[g] -= min(-gap, shares[g] - low[g])
    return tuple(shares)


def _moves(groups: Tuple[str, ...], before: Tuple[int, ...], after: Tuple[int, ...]) -> Tuple[ShareMove, ...]:
    """Pair the groups that lose units with those that gain them, largest first."""
    losing = sorted(((b - a, g) for g, b, a in zip(groups, before, after) if b > a), reverse=True)
    gaining = sorted(((a - b, g) for g, b, a in zip(groups, before, after) if a > b), reverse=True)
    moves: List[ShareMove] = []
    while losing and gaining:
        (give, source), (take, target) = losing[0], gaining[0]
        amount = min(give, take)
        moves.append(ShareMove(source, target, amount))
        losing = [(give - amount, source)] + losing[1:] if give > amount else losing[1:]
        gaining = [(take - amount, target)] + gaining[1:] if take > amount else gaining[1:]
    return tuple(moves)
