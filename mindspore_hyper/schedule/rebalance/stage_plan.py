"""A plan that moves layers between pipeline stages: which layers go where, with what state.

Stages hold contiguous layer ranges in model order, written as layer counts per stage. Moving a
boundary moves whole layers with their parameters and optimizer states, and the layers still run
in the same order on the same inputs, so training numerics do not change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Tuple

from mindspore_hyper.schedule.errors import ScheduleError

__all__ = ["LayerSpec", "LayerMove", "StageMovePlan", "stage_of_layers", "check_layer_counts"]


@dataclass(frozen=True)
class LayerSpec:
    """One layer of the pipelined model, in model order.

    Attributes:
        name: the layer's name (e.g. its Cell name).
        weight: relative cost prior (e.g. FLOPs or parameter count), > 0; a stage's measured time
            is split among its layers in proportion to it.
        parameters: names of the layer's parameters (migrate with the layer).
        optimizer_states: names of the optimizer states of those parameters (e.g. MindSpore
            Adam's "moment1.<param>", "moment2.<param>").
    """

    name: str
    weight: float = 1.0
    parameters: Tuple[str, ...] = ()
    optimizer_states: Tuple[str, ...] = ()

    def __post_init__(self):
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) \
                or not math.isfinite(self.weight) or self.weight <= 0:
            raise ValueError(f"LayerSpec({self.name!r}).weight={self.weight!r}: expected a finite number > 0")
        object.__setattr__(self, "parameters", tuple(self.parameters))
        object.__setattr__(self, "optimizer_states", tuple(self.optimizer_states))


@dataclass(frozen=True)
class LayerMove:
    """Layer `layer` leaves `source_stage` for `target_stage`, taking its parameters and states."""

    layer: int
    name: str
    source_stage: int
    target_stage: int
    parameters: Tuple[str, ...]
    optimizer_states: Tuple[str, ...]


def check_layer_counts(layer_counts: Sequence[int], num_layers: int) -> Tuple[int, ...]:
    """`layer_counts` as a tuple, or ValueError unless they are ints >= 1 summing to `num_layers`."""
    counts = tuple(layer_counts)
    if not counts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts) \
            or sum(counts) != num_layers:
        raise ValueError(f"layer_counts={list(counts)}: expected ints >= 1 summing to the {num_layers} layers")
    return counts


def stage_of_layers(layer_counts: Sequence[int]) -> Tuple[int, ...]:
    """For each layer in model order, the stage holding it."""
    return tuple(stage for stage, count in enumerate(layer_counts) for _ in range(count))


@dataclass(frozen=True)
class StageMovePlan:
    """Layer counts per stage before and after, and the layer moves between them.

    Attributes:
        before, after: layers per stage in model order.
        moves: one LayerMove per layer whose stage changes, in layer order (empty: no move).
        predicted_before, predicted_after: predicted time per stage (seconds).
        reason: why the planner moves or does not.
    """

    before: Tuple[int, ...]
    after: Tuple[int, ...]
    moves: Tuple[LayerMove, ...]
    predicted_before: Tuple[float, ...]
    predicted_after: Tuple[float, ...]
    reason: str

    @property
    def is_empty(self) -> bool:
        return not self.moves

    def validate(self) -> None:
        """Raise ScheduleError("plan") unless the moves turn `before` into `after` exactly.

        Both splits hold the same layers, every stage keeps at least one, and each layer whose
        stage changes has exactly one move naming its old and new stage.
        """
        if len(self.before) != len(self.after):
            raise ScheduleError("plan", f"before has {len(self.before)} stages, after has {len(self.after)}")
        if min(self.before + self.after) < 1 or sum(self.before) != sum(self.after):
            raise ScheduleError("plan", f"layer counts {list(self.before)} -> {list(self.after)}: every stage needs "
                                        f"a layer and the total must not change")
        old, new = stage_of_layers(self.before), stage_of_layers(self.after)
        expected = [(layer, old[layer], new[layer]) for layer in range(len(old)) if old[layer] != new[layer]]
        got = [(m.layer, m.source_stage, m.target_stage) for m in self.moves]
        if got != expected:
            raise ScheduleError("plan", f"moves (layer, from, to) {got} do not turn {list(self.before)} into "
                                        f"{list(self.after)}; expected {expected}")
