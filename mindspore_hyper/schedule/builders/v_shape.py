"""ZB-V: the V-shaped zero-bubble schedule (Qi et al., "Pipeline Parallelism with Controllable Memory").

Each rank holds two chunks: rank r runs stage r (chunk 0, on the way down) and stage 2p-1-r
(chunk 1, on the way back), so the first and last stages share rank 0 and the forward path turns
around on rank p-1 without a send. Backwards are split into input and weight gradients. Per rank
the order is built in phases:

- warm-up: 2(p-r)-1 chunk-0 forwards; r pairs (chunk-1 forward, chunk-0 forward); p-r triples
  (chunk-1 forward, input grad, weight grad);
- steady: (chunk-0 forward while any is left) then chunk-0 input and weight grads, then chunk-1
  forward, input and weight grads;
- cool-down: r pairs of input grads (chunk 0, chunk 1); p-r pairs (chunk-0 input grad, oldest
  pending chunk-0 weight grad); then the pending weight grads, chunk 1 first.

Microbatches are numbered per (pass, chunk) in order of appearance. The phases assume at least
2p-1 microbatches; with fewer the order is built for 2p-1 and the passes of microbatches that
do not exist are dropped (dependencies only join passes of one microbatch, so the rest stays
valid).
"""
from __future__ import annotations

from collections import Counter
from typing import List, Tuple

from mindspore_hyper.schedule.actions import ActionKind
from mindspore_hyper.schedule.builders.common import ComputeStep, assemble
from mindspore_hyper.schedule.schedule import Schedule

__all__ = ["build_zb_v", "v_stage_to_rank"]

_F, _B, _W = ActionKind.FORWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT
Token = Tuple[ActionKind, int]  # (pass, chunk)


def v_stage_to_rank(num_stages: int) -> Tuple[int, ...]:
    """Stage s and stage 2p-1-s on the same rank: ranks 0..p-1 then p-1..0."""
    return tuple(range(num_stages)) + tuple(reversed(range(num_stages)))


def _phase_tokens(rank: int, p: int, n: int) -> List[Token]:
    down, back = 0, 1
    tokens: List[Token] = [(_F, down)] * (2 * (p - rank) - 1)
    tokens += [(_F, back), (_F, down)] * rank
    tokens += [(_F, back), (_B, back), (_W, back)] * (p - rank)
    forwards_left = n - (2 * p - rank - 1)
    for _ in range(n - p):
        if forwards_left > 0:
            tokens.append((_F, down))
            forwards_left -= 1
        tokens += [(_B, down), (_W, down), (_F, back), (_B, back), (_W, back)]
    tokens += [(_B, down), (_B, back)] * rank
    tokens += [(_B, down), (_W, down)] * (p - rank)
    tokens += [(_W, back)] * rank + [(_W, down)] * rank
    return tokens


def build_zb_v(num_stages: int, num_microbatches: int, num_chunks: int) -> Schedule:
    """ZB-V on p = num_stages ranks, two chunks each.

    Raises:
        ValueError: num_chunks is not 2 (a V needs exactly two chunks per rank).
    """
    p, m = num_stages, num_microbatches
    if num_chunks != 2:
        raise ValueError(f"num_chunks={num_chunks}: V-shaped schedules ('zb_v') need exactly 2 chunks per rank")
    padded = max(m, 2 * p - 1)
    orders = []
    for rank in range(p):
        stages = (rank, 2 * p - 1 - rank)
        seen: Counter = Counter()
        order: List[ComputeStep] = []
        for kind, chunk in _phase_tokens(rank, p, padded):
            mb = seen[(kind, chunk)]
            seen[(kind, chunk)] += 1
            if mb < m:
                order.append((kind, stages[chunk], mb))
        orders.append(order)
    return assemble("zb_v", m, v_stage_to_rank(p), orders)
