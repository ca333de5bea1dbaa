"""Upstream's `MetaStep` / `MetaStepType`: one step of a rank's pipeline execution order.

Upstream's schedules expose `exec_order` (pipeline rank -> list of MetaStep): forwards,
backwards and the sends/receives between them. Here a schedule is this package's `Schedule`
(schedules as data, `mindspore_hyper.schedule`); `meta_steps` reads a rank's action list in
upstream's vocabulary. A send names the stage that sends, a receive the stage that receives,
as in upstream.
"""
from __future__ import annotations

import enum
from typing import Dict, List

from mindspore_hyper.schedule.actions import Action, ActionKind, Payload
from mindspore_hyper.schedule.schedule import Schedule

__all__ = ["MetaStepType", "MetaStep", "meta_steps"]


class MetaStepType(enum.Enum):
    """What a MetaStep does (upstream's members, in upstream's order)."""

    FWD = enum.auto()
    BWD = enum.auto()
    FWD_RECV = enum.auto()
    FWD_SEND = enum.auto()
    BWD_RECV = enum.auto()
    BWD_SEND = enum.auto()


class MetaStep:
    """One step of a pipeline rank's execution order.

    Args:
        micro_index: the microbatch, from 0.
        meta_type: what the step does.
        stage_index: the (virtual) stage it belongs to.

    Raises:
        TypeError: `meta_type` is not a MetaStepType, or an index is not an int >= 0.
    """

    def __init__(self, micro_index: int, meta_type: MetaStepType, stage_index: int):
        if not isinstance(meta_type, MetaStepType):
            raise TypeError(f"MetaStep: meta_type must be a MetaStepType, but got {meta_type!r}")
        for name, value in (("micro_index", micro_index), ("stage_index", stage_index)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TypeError(f"MetaStep: {name} must be an int >= 0, but got {value!r}")
        self._micro_index, self._type, self._stage_index = micro_index, meta_type, stage_index

    @property
    def micro_index(self) -> int:
        return self._micro_index

    @property
    def type(self) -> MetaStepType:
        return self._type

    @property
    def stage_index(self) -> int:
        return self._stage_index

    def _key(self):
        return self._type, self._micro_index, self._stage_index

    def __eq__(self, other):
        if not isinstance(other, MetaStep):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"MetaStep(type={self.type}, micro_index={self.micro_index}, stage_index={self.stage_index})"

    __str__ = __repr__


_COMPUTE = {ActionKind.FORWARD: MetaStepType.FWD, ActionKind.BACKWARD: MetaStepType.BWD}
_P2P = {(ActionKind.SEND, Payload.ACTIVATION): MetaStepType.FWD_SEND,
        (ActionKind.RECV, Payload.ACTIVATION): MetaStepType.FWD_RECV,
        (ActionKind.SEND, Payload.GRADIENT): MetaStepType.BWD_SEND,
        (ActionKind.RECV, Payload.GRADIENT): MetaStepType.BWD_RECV}


def _step(action: Action) -> MetaStep:
    kind = _COMPUTE.get(action.kind) or _P2P.get((action.kind, action.payload))
    if kind is None:  # split backwards (zero-bubble) have no upstream MetaStepType
        raise ValueError(f"{action}: upstream's MetaStepType has no {action.kind.value!r} step")
    return MetaStep(action.microbatch, kind, action.stage)


def meta_steps(schedule: Schedule) -> Dict[int, List[MetaStep]]:
    """Every pipeline rank's actions as upstream's `exec_order` (rank -> MetaSteps, in order).

    Raises:
        ValueError: the schedule splits backwards (no upstream MetaStepType for those).
    """
    return {rank: [_step(a) for a in actions] for rank, actions in enumerate(schedule.actions)}
