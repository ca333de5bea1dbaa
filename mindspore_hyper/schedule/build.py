"""`build_schedule`: the registry of schedule families and the checks every request goes through."""
from __future__ import annotations

from typing import Callable, Dict

from mindspore_hyper.schedule.builders import (build_1f1b, build_dualpipe_v, build_gpipe, build_interleaved_1f1b,
                                               build_zb_h1, build_zb_v)
from mindspore_hyper.schedule.schedule import Schedule
from mindspore_hyper.schedule.validate import validate_schedule

__all__ = ["build_schedule", "SCHEDULE_BUILDERS", "SCHEDULE_KINDS"]

SCHEDULE_BUILDERS: Dict[str, Callable[[int, int, int], Schedule]] = {
    "gpipe": build_gpipe,
    "1f1b": build_1f1b,
    "interleaved_1f1b": build_interleaved_1f1b,
    "zb_h1": build_zb_h1,
    "zb_v": build_zb_v,
    "dualpipe_v": build_dualpipe_v,
}
SCHEDULE_KINDS = tuple(SCHEDULE_BUILDERS)


def build_schedule(kind: str, num_stages: int, num_microbatches: int, num_chunks: int = 1) -> Schedule:
    """Build and validate a pipeline schedule.

    Args:
        kind: one of SCHEDULE_KINDS: "gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v",
            "dualpipe_v".
        num_stages: p, the number of pipeline ranks.
        num_microbatches: m, microbatches per step.
        num_chunks: v, model chunks per rank (the model is cut into p*v virtual stages); 1 for
            gpipe/1f1b/zb_h1, >= 2 for interleaved_1f1b, exactly 2 for zb_v and dualpipe_v.

    Returns:
        A Schedule that passed `validate_schedule`.

    Raises:
        ValueError: unknown kind, a non-positive or non-int count, or a request the family cannot
            serve (the message names the argument and what was expected).
    """
    if kind not in SCHEDULE_BUILDERS:
        raise ValueError(f"kind={kind!r}: expected one of {list(SCHEDULE_KINDS)}")
    for name, value in (("num_stages", num_stages), ("num_microbatches", num_microbatches),
                        ("num_chunks", num_chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: expected a positive int")
    schedule = SCHEDULE_BUILDERS[kind](num_stages, num_microbatches, num_chunks)
    validate_schedule(schedule)
    return schedule
