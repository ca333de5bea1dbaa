"""The steps of a pipeline schedule: one rank's compute or point-to-point action on one microbatch.

A runtime walks a rank's action list in order and executes each action. `stage` is always a
*local* stage of the rank (a virtual stage when a rank holds several chunks): a send names the
stage that produced the tensor, a receive names the stage that consumes it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

__all__ = ["ActionKind", "Payload", "Action", "P2PTensor", "COMPUTE_KINDS", "BACKWARD_KINDS", "P2P_KINDS"]


class ActionKind(str, enum.Enum):
    """What an action does."""

    FORWARD = "forward"
    BACKWARD = "backward"  # full backward: input gradient and weight gradient together
    BACKWARD_INPUT = "backward_input"  # gradient w.r.t. the stage input only (zero-bubble "B")
    BACKWARD_WEIGHT = "backward_weight"  # gradient w.r.t. the stage weights only (zero-bubble "W")
    SEND = "send"
    RECV = "recv"


class Payload(str, enum.Enum):
    """What a send/receive carries between neighbouring stages."""

    ACTIVATION = "activation"  # stage s output -> stage s+1 input
    GRADIENT = "gradient"  # gradient of stage s input -> stage s-1 output gradient


COMPUTE_KINDS = frozenset({ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT,
                           ActionKind.BACKWARD_WEIGHT})
BACKWARD_KINDS = frozenset({ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT})
P2P_KINDS = frozenset({ActionKind.SEND, ActionKind.RECV})

_SHORT = {ActionKind.FORWARD: "F", ActionKind.BACKWARD: "B", ActionKind.BACKWARD_INPUT: "Bi",
          ActionKind.BACKWARD_WEIGHT: "Bw"}


@dataclass(frozen=True)
class P2PTensor:
    """The identity of a tensor crossing ranks: a send and a receive pair up iff these are equal.

    Attributes:
        payload: activation or gradient.
        src_stage: the stage that produces it.
        dst_stage: the stage that consumes it.
        microbatch: the microbatch it belongs to.
    """

    payload: Payload
    src_stage: int
    dst_stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.payload.value} s{self.src_stage}->s{self.dst_stage} mb{self.microbatch}"


@dataclass(frozen=True)
class Action:
    """One step of a rank's program.

    Attributes:
        kind: forward, backward (full), backward_input, backward_weight, send or recv.
        stage: the rank-local (virtual) stage the action belongs to.
        chunk: which of the rank's chunks `stage` is (0 = the rank's earliest stage in model order).
        microbatch: the microbatch index, from 0.
        peer: for send/recv, the other rank; None for compute.
        payload: for send/recv, activation or gradient; None for compute.
    """

    kind: ActionKind
    stage: int
    chunk: int
    microbatch: int
    peer: Optional[int] = None
    payload: Optional[Payload] = None

    def __post_init__(self):
        if self.kind not in [k.value for k in ActionKind]:
            raise ValueError(f"Action.kind={self.kind!r}: expected one of {[k.value for k in ActionKind]}")
        object.__setattr__(self, "kind", ActionKind(self.kind))
        for name in ("stage", "chunk", "microbatch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Action.{name}={value!r}: expected an int >= 0")
        if self.kind in P2P_KINDS:
            if isinstance(self.peer, bool) or not isinstance(self.peer, int) or self.peer < 0:
                raise ValueError(f"Action.peer={self.peer!r}: a {self.kind.value} needs the peer rank (int >= 0)")
            if self.payload not in [p.value for p in Payload]:
                raise ValueError(f"Action.payload={self.payload!r}: a {self.kind.value} needs 'activation' or "
                                 f"'gradient'")
            object.__setattr__(self, "payload", Payload(self.payload))
        elif self.peer is not None or self.payload is not None:
            raise ValueError(f"Action(kind={self.kind.value!r}): peer and payload are only for send/recv, "
                             f"got peer={self.peer!r}, payload={self.payload!r}")

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def tensor(self) -> P2PTensor:
        """The tensor a send/recv moves (raises ValueError for compute actions)."""
        if self.kind not in P2P_KINDS:
            raise ValueError(f"{self}: only send/recv actions move a tensor")
        forward = self.payload is Payload.ACTIVATION
        if self.kind is ActionKind.SEND:
            other = self.stage + 1 if forward else self.stage - 1
            return P2PTensor(self.payload, self.stage, other, self.microbatch)
        other = self.stage - 1 if forward else self.stage + 1
        return P2PTensor(self.payload, other, self.stage, self.microbatch)

    def __str__(self) -> str:
        if self.kind is ActionKind.SEND:
            return f"send {self.payload.value} s{self.stage} mb{self.microbatch} -> rank {self.peer}"
        if self.kind is ActionKind.RECV:
            return f"recv {self.payload.value} s{self.stage} mb{self.microbatch} <- rank {self.peer}"
        return f"{_SHORT[self.kind]} s{self.stage} mb{self.microbatch}"
