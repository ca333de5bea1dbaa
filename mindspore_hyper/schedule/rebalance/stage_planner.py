"""Plan stage boundaries: the contiguous split with the smallest bottleneck, reached with fewest moves."""
from __future__ import annotations

from itertools import accumulate
from typing import List, Sequence, Tuple

from mindspore_hyper.schedule.rebalance.history import check_loads
from mindspore_hyper.schedule.rebalance.imbalance import detect_imbalance
from mindspore_hyper.schedule.rebalance.policy import RebalancePolicy
from mindspore_hyper.schedule.rebalance.stage_plan import (LayerMove, LayerSpec, StageMovePlan, check_layer_counts,
                                                          stage_of_layers)

__all__ = ["plan_stage_move", "layer_costs_from_stage_times"]

_TOLERANCE = 1e-9


def layer_costs_from_stage_times(stage_times: Sequence[float], layer_counts: Sequence[int],
                                 layers: Sequence[LayerSpec]) -> Tuple[float, ...]:
    """Split each stage's time among its layers in proportion to their weights."""
    owner = stage_of_layers(layer_counts)
    stage_weight = [0.0] * len(layer_counts)
    for layer, spec in zip(owner, layers):
        stage_weight[layer] += spec.weight
    return tuple(stage_times[s] * spec.weight / stage_weight[s] for s, spec in zip(owner, layers))


def plan_stage_move(layer_costs: Sequence[float], layers: Sequence[LayerSpec], layer_counts: Sequence[int],
                    policy: RebalancePolicy = RebalancePolicy()) -> StageMovePlan:
    """Decide whether and how to move layers between stages (never moves anything itself).

    When some stage is outside [underload, overload] x mean, find the smallest achievable
    bottleneck over all contiguous splits, then among the splits reaching it the one whose
    boundaries move least; keep it only if it cuts the bottleneck by at least min_gain.

    Args:
        layer_costs: predicted time of each layer (seconds), model order.
        layers: the layers (parameters and optimizer states to migrate).
        layer_counts: layers per stage now.
        policy: thresholds and minimum gain.

    Returns:
        A StageMovePlan; `moves` is empty when nothing should move, and `reason` says why.

    Raises:
        ValueError: counts that are not ints >= 1 summing to len(layers), or bad layer costs.
    """
    counts = check_layer_counts(layer_counts, len(layers))
    layer_costs = check_loads("layer_costs", layer_costs, len(layers))
    before = _stage_loads(layer_costs, counts)
    imbalance = detect_imbalance(before, policy.overload, policy.underload)
    if imbalance.balanced:
        return _no_move(counts, before, f"balanced: every stage within [{policy.underload}, {policy.overload}] "
                                        f"x mean")
    best = _smallest_bottleneck(layer_costs, len(counts))
    after = _closest_split(layer_costs, counts, best)
    predicted = _stage_loads(layer_costs, after)
    gain = 1 - max(predicted) / max(before)
    flagged = ", ".join(f"stage {i} at {imbalance.ratios[i]:.2f} x mean"
                        for i in imbalance.overloaded + imbalance.underloaded)
    if gain < policy.min_gain:
        return _no_move(counts, before, f"{flagged}, but the best split cuts the bottleneck by {gain:.1%} "
                                        f"(< min_gain {policy.min_gain:.0%})")
    old, new = stage_of_layers(counts), stage_of_layers(after)
    moves = tuple(LayerMove(i, layers[i].name, old[i], new[i], layers[i].parameters, layers[i].optimizer_states)
                  for i in range(len(old)) if old[i] != new[i])
    return StageMovePlan(counts, after, moves, before, predicted,
                         f"{flagged}: moving {len(moves)} layer(s) cuts the bottleneck by {gain:.1%}")


def _no_move(counts: Tuple[int, ...], loads: Tuple[float, ...], reason: str) -> StageMovePlan:
    return StageMovePlan(counts, counts, (), loads, loads, reason)


def _stage_loads(layer_costs: Sequence[float], counts: Sequence[int]) -> Tuple[float, ...]:
    bounds = [0, *accumulate(counts)]
    return tuple(sum(layer_costs[bounds[s]:bounds[s + 1]]) for s in range(len(counts)))


def _smallest_bottleneck(costs: Sequence[float], stages: int) -> float:
    """Min over contiguous splits into `stages` non-empty parts of the largest part sum (DP)."""
    prefix = [0.0, *accumulate(costs)]
    n = len(costs)
    inf = float("inf")
    best: List[float] = [inf] * (n + 1)  # best[i]: first i layers split into the parts so far
    for i in range(1, n + 1):
        best[i] = prefix[i]
    for _ in range(1, stages):
        best = [inf] + [min((max(best[j], prefix[i] - prefix[j]) for j in range(1, i)), default=inf)
                        for i in range(1, n + 1)]
    return best[n]


def _closest_split(costs: Sequence[float], counts: Tuple[int, ...], limit: float) -> Tuple[int, ...]:
    """The split with every part <= limit whose boundaries move the fewest layers in total."""
    prefix = [0.0, *accumulate(costs)]
    current = [0, *accumulate(counts)]
    n, stages = len(costs), len(counts)
    bound = limit * (1 + _TOLERANCE) + _TOLERANCE
    inf = float("inf")
    # moved[k][i]: fewest boundary moves placing boundary k at layer i with parts 0..k-1 <= limit
    moved = [[inf] * (n + 1) for _ in range(stages + 1)]
    choice = [[0] * (n + 1) for _ in range(stages + 1)]
    moved[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                if moved[k - 1][j] < inf and prefix[i] - prefix[j] <= bound:
                    total = moved[k - 1][j] + abs(i - current[k])
                    if total < moved[k][i]:
                        moved[k][i], choice[k][i] = total, j
    edges = [n]
    for k in range(stages, 0, -1):
        edges.append(choice[k][edges[-1]])
    edges.reverse()
    return tuple(edges[k + 1] - edges[k] for k in range(stages))
