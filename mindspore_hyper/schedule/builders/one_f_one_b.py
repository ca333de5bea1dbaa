"""1F1B (PipeDream-flush) and its zero-bubble variant ZB-H1.

Rank r runs p-r-1 warm-up forwards, then alternates one forward and one backward, then drains the
remaining backwards, so at most p microbatches are alive on rank 0. ZB-H1 splits each backward
into an input-gradient part (on the critical path) and a weight-gradient part; rank r runs the
weight gradient of microbatch k right after the input gradient of microbatch k+r, so the
postponed weight gradients fill the drain phase and the bubble shrinks from (p-1)(F+B+W) to
(p-1)(F+B-W) while the peak stays p microbatches.
"""
from __future__ import annotations

from typing import List

from mindspore_hyper.schedule.actions import ActionKind
from mindspore_hyper.schedule.builders.checks import require_microbatches_at_least_stages, require_one_chunk
from mindspore_hyper.schedule.builders.common import ComputeStep, assemble
from mindspore_hyper.schedule.schedule import Schedule

__all__ = ["build_1f1b", "build_zb_h1"]


def _one_f_one_b_order(rank: int, num_stages: int, num_microbatches: int, backward: ActionKind) -> List[ComputeStep]:
    warmup = num_stages - rank - 1
    order: List[ComputeStep] = [(ActionKind.FORWARD, rank, mb) for mb in range(warmup)]
    for mb in range(num_microbatches - warmup):
        order.append((ActionKind.FORWARD, rank, mb + warmup))
        order.append((backward, rank, mb))
    order += [(backward, rank, mb) for mb in range(num_microbatches - warmup, num_microbatches)]
    return order


def build_1f1b(num_stages: int, num_microbatches: int, num_chunks: int) -> Schedule:
    """1F1B with full backwards on p = num_stages ranks, stage s on rank s."""
    require_one_chunk("1f1b", num_chunks)
    require_microbatches_at_least_stages("1f1b", num_stages, num_microbatches)
    orders = [_one_f_one_b_order(r, num_stages, num_microbatches, ActionKind.BACKWARD) for r in range(num_stages)]
    return assemble("1f1b", num_microbatches, tuple(range(num_stages)), orders)


def build_zb_h1(num_stages: int, num_microbatches: int, num_chunks: int) -> Schedule:
    """ZB-H1: 1F1B with split backwards, rank r's weight gradients lagging its input gradients by r."""
    require_one_chunk("zb_h1", num_chunks)
    require_microbatches_at_least_stages("zb_h1", num_stages, num_microbatches)
    orders = []
    for rank in range(num_stages):
        order: List[ComputeStep] = []
        for step in _one_f_one_b_order(rank, num_stages, num_microbatches, ActionKind.BACKWARD_INPUT):
            order.append(step)
            if step[0] is ActionKind.BACKWARD_INPUT and step[2] >= rank:
                order.append((ActionKind.BACKWARD_WEIGHT, rank, step[2] - rank))
        lagging = range(num_microbatches - rank, num_microbatches)
        order += [(ActionKind.BACKWARD_WEIGHT, rank, mb) for mb in lagging]
        orders.append(order)
    return assemble("zb_h1", num_microbatches, tuple(range(num_stages)), orders)
