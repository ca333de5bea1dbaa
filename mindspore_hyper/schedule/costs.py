"""Compute costs of schedule actions, by (action kind, virtual stage), in seconds (or any one unit)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

from mindspore_hyper.schedule.actions import ActionKind

__all__ = ["ActionCosts", "Cost", "MeasuredCosts"]

Cost = Union[float, Sequence[float]]
MeasuredCosts = Union[Mapping[Tuple[ActionKind, int], float], Callable[[ActionKind, int], float]]
CostKey = Tuple[ActionKind, int]


@dataclass(frozen=True)
class ActionCosts:
    """The cost of every compute (kind, stage) a schedule uses; a full backward costs input + weight.

    Attributes:
        table: cost per (ActionKind, virtual stage), all finite and >= 0.
    """

    table: Mapping[CostKey, float]

    def __call__(self, kind: ActionKind, stage: int) -> float:
        return self.table[(kind, stage)]

    @classmethod
    def resolve(cls, needed: Iterable[CostKey], num_virtual_stages: int, forward: Cost = 1.0,
                backward_input: Cost = 1.0, backward_weight: Cost = 1.0,
                measured: Optional[MeasuredCosts] = None) -> "ActionCosts":
        """Resolve the costs of the (kind, stage) pairs in `needed`.

        Args:
            needed: the compute (kind, stage) pairs to price.
            num_virtual_stages: length a per-stage list must have.
            forward, backward_input, backward_weight: one cost for every stage, or one per
                virtual stage.
            measured: measured costs per (kind, stage) (a mapping, e.g. `ScheduleTimeline.mean_costs()`,
                or a callable). It replaces the three arguments above, which must then stay at
                1.0; a full backward it lacks is its input + weight costs.

        Raises:
            ValueError: a bad cost (naming the argument), both `measured` and explicit costs, or
                a (kind, stage) `measured` cannot price.
        """
        defaults = {"forward": forward, "backward_input": backward_input, "backward_weight": backward_weight}
        if measured is not None:
            explicit = [name for name, value in defaults.items() if not (isinstance(value, (int, float))
                                                                         and value == 1.0)]
            if explicit:
                raise ValueError(f"measured costs replace {explicit}; pass either measured or explicit costs")
            lookup = _measured_lookup(measured)
        else:
            per_stage = {ActionKind(name): _per_stage(name, value, num_virtual_stages)
                         for name, value in defaults.items()}

            def lookup(kind: ActionKind, stage: int) -> Optional[float]:
                return per_stage[kind][stage] if kind in per_stage else None

        table: Dict[CostKey, float] = {}
        kind_order = list(ActionKind)
        for kind, stage in sorted(needed, key=lambda key: (key[1], kind_order.index(key[0]))):
            cost = lookup(kind, stage)
            if cost is None and kind is ActionKind.BACKWARD:
                parts = [lookup(ActionKind.BACKWARD_INPUT, stage), lookup(ActionKind.BACKWARD_WEIGHT, stage)]
                cost = None if None in parts else parts[0] + parts[1]
            if cost is None:
                raise ValueError(f"measured: no cost for ({kind.value}, stage {stage})")
            table[(kind, stage)] = _checked(f"cost of ({kind.value}, stage {stage})", cost)
        return cls(table)


def _measured_lookup(measured: MeasuredCosts) -> Callable[[ActionKind, int], Optional[float]]:
    if callable(measured):
        return measured
    if not isinstance(measured, Mapping):
        raise ValueError(f"measured={type(measured).__name__}: expected a mapping or callable of "
                         f"(action kind, stage) -> cost")
    by_key = {(ActionKind(kind), stage): value for (kind, stage), value in measured.items()}
    return lambda kind, stage: by_key.get((kind, stage))


def _per_stage(name: str, value: Cost, num_virtual_stages: int) -> Tuple[float, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (_checked(name, value),) * num_virtual_stages
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{name}={value!r}: expected a number or one number per virtual stage")
    if len(value) != num_virtual_stages:
        raise ValueError(f"{name}: {len(value)} costs given, expected one per virtual stage ({num_virtual_stages})")
    return tuple(_checked(f"{name}[{i}]", v) for i, v in enumerate(value))


def _checked(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r}: expected a finite number >= 0")
    return float(value)
