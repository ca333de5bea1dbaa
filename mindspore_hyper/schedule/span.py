"""One interval of work on one lane of a timeline: the value every timeline is built from."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Optional

from mindspore_hyper.schedule.actions import Action

__all__ = ["Span", "lane_name"]


@dataclass(frozen=True)
class Span:
    """What ran on one lane from `start` to `end`.

    Attributes:
        lane: where it ran: a rank (int) or a group name (any hashable).
        label: what it is, e.g. "F s0 mb1", "text_encoder forward", "lm b3".
        start, end: seconds (simulated units for a simulation), finite, end >= start.
        kind: the kind of work, e.g. "forward", "encode", "run": charts colour by it and traces
            use it as the category.
        busy: True when the lane computes; False for a wait (a receive, a queue): waits count as
            idle time and are drawn hatched.
        action: the schedule action of a pipeline span, else None.
        args: extra facts shown with the span in a trace (e.g. {"batch": 3}); not compared.

    Raises:
        ValueError: a bad field, named.
    """

    lane: Hashable
    label: str
    start: float
    end: float
    kind: str = ""
    busy: bool = True
    action: Optional[Action] = None
    args: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        try:
            hash(self.lane)
        except TypeError:
            raise ValueError(f"Span.lane={self.lane!r}: expected a hashable lane (a rank or a group name)") from None
        if not isinstance(self.label, str):
            raise ValueError(f"Span.label={self.label!r}: expected a str")
        if not isinstance(self.kind, str):
            raise ValueError(f"Span({self.label}).kind={self.kind!r}: expected a str")
        if not (isinstance(self.start, (int, float)) and isinstance(self.end, (int, float))
                and math.isfinite(self.start) and math.isfinite(self.end)) or self.end < self.start:
            raise ValueError(f"Span({self.label}): start={self.start!r}, end={self.end!r}; expected finite times "
                             f"with end >= start")
        if self.action is not None and not isinstance(self.action, Action):
            raise ValueError(f"Span({self.label}).action={self.action!r}: expected an Action or None")

    @classmethod
    def for_action(cls, rank: int, action: Action, start: float, end: float) -> "Span":
        """The span of one pipeline action on `rank`: busy iff it computes; a trace shows its stage,
        chunk and microbatch (and peer and payload for a send/receive).

        Raises:
            ValueError: `rank` is not an int >= 0, `action` not an Action, or bad times.
        """
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"Span.for_action: rank={rank!r}: expected an int >= 0")
        if not isinstance(action, Action):
            raise ValueError(f"Span.for_action: action={action!r}: expected an Action")
        args = {"stage": action.stage, "chunk": action.chunk, "microbatch": action.microbatch}
        if action.peer is not None:
            args.update(peer=action.peer, payload=action.payload.value)
        return cls(rank, str(action), start, end, action.kind.value, action.is_compute, action, args)

    @property
    def duration(self) -> float:
        return self.end - self.start


def lane_name(lane: Hashable) -> str:
    """How traces and charts name a lane: "rank 3" for a rank, the name itself otherwise."""
    return f"rank {lane}" if isinstance(lane, int) and not isinstance(lane, bool) else str(lane)
