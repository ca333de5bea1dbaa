"""V-shaped schedules: two chunks per rank, rank r running stage r and stage 2p-1-r.

The forward goes down ranks 0..p-1 and comes back up, so the first and last stages share rank 0
and the path turns around on rank p-1 without a send. Each family writes a rank's order as
tokens (pass, chunk); microbatches are numbered per (forward | backward, chunk) in order of
appearance, and a weight-gradient token runs the oldest pending input gradient's weight part (of
its chunk, or of either chunk when the token names none).

ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"), backwards split:
- warm-up: 2(p-r)-1 chunk-0 forwards; r pairs (chunk-1 forward, chunk-0 forward); p-r triples
  (chunk-1 forward, input grad, weight grad);
- steady: (chunk-0 forward while any is left) then chunk-0 input and weight grads, then chunk-1
  forward, input and weight grads;
- cool-down: r pairs of input grads (chunk 0, chunk 1); p-r pairs (chunk-0 input grad, weight
  grad); then the pending weight grads, chunk 1 first.
The phases assume at least 2p-1 microbatches; with fewer the order is built for 2p-1 and the
passes of microbatches that do not exist are dropped (dependencies only join passes of one
microbatch, so the rest stays valid).

DualPipeV (DeepSeek's DualPipe folded into a V), full backwards in the middle and split ones at
the edges, m >= 2p. A forward of one microbatch and a backward of another form an overlapped
pair ("F&B"): DualPipe runs them together to hide all-to-all communication, so the pair starts
once both inputs arrived; here its two computes follow each other (forward first), which is what
they cost on one compute stream. Per rank:
- 2(p-r-1) chunk-0 forwards; r+1 pairs (chunk-0 forward, chunk-1 forward);
- p-r-1 triples (chunk-1 input grad, weight grad, chunk-1 forward);
- m-2p+r+1 times: F&B (chunk-0 forward, chunk-1 backward), F&B (chunk-1 forward, chunk-0
  backward); the first chunk-0 forward / chunk-1 backward of the last rank is not overlapped;
- p-r-1 times: chunk-1 backward, F&B (chunk-1 forward, chunk-0 backward);
- r+1 pairs (chunk-1 backward, chunk-0 backward), split into input grads from the middle pair on
  (from its chunk-1 backward on odd ranks, its chunk-0 backward on even ranks);
- p-r-1 pairs (weight grad, chunk-0 input grad); r+1 weight grads.
"""
from __future__ import annotations

from collections import Counter
from typing import List, Optional, Tuple, Union

from mindspore_hyper.schedule.actions import ActionKind
from mindspore_hyper.schedule.builders.common import ComputeStep, Overlapped, assemble
from mindspore_hyper.schedule.schedule import Schedule

__all__ = ["build_zb_v", "build_dualpipe_v", "v_stage_to_rank"]

_F, _B, _BI, _W = ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT
Token = Tuple[ActionKind, Optional[int]]  # (pass, chunk); a weight grad of either chunk has chunk None
Pair = Tuple[Token, Token]  # an overlapped forward/backward pair
DOWN, BACK = 0, 1


def v_stage_to_rank(num_stages: int) -> Tuple[int, ...]:
    """Stage s and stage 2p-1-s on the same rank: ranks 0..p-1 then p-1..0."""
    return tuple(range(num_stages)) + tuple(reversed(range(num_stages)))


def _require_two_chunks(kind: str, num_chunks: int) -> None:
    if num_chunks != 2:
        raise ValueError(f"num_chunks={num_chunks}: V-shaped schedules ({kind!r}) need exactly 2 chunks per rank")


def _zb_v_tokens(rank: int, p: int, n: int) -> List[Token]:
    tokens: List[Token] = [(_F, DOWN)] * (2 * (p - rank) - 1)
    tokens += [(_F, BACK), (_F, DOWN)] * rank
    tokens += [(_F, BACK), (_BI, BACK), (_W, BACK)] * (p - rank)
    forwards_left = n - (2 * p - rank - 1)
    for _ in range(n - p):
        if forwards_left > 0:
            tokens.append((_F, DOWN))
            forwards_left -= 1
        tokens += [(_BI, DOWN), (_W, DOWN), (_F, BACK), (_BI, BACK), (_W, BACK)]
    tokens += [(_BI, DOWN), (_BI, BACK)] * rank
    tokens += [(_BI, DOWN), (_W, DOWN)] * (p - rank)
    tokens += [(_W, BACK)] * rank + [(_W, DOWN)] * rank
    return tokens


def _dualpipe_v_tokens(rank: int, p: int, m: int) -> List[Union[Token, Pair]]:
    tokens: List[Union[Token, Pair]] = [(_F, DOWN)] * (2 * (p - rank - 1))
    tokens += [(_F, DOWN), (_F, BACK)] * (rank + 1)
    tokens += [(_BI, BACK), (_W, None), (_F, BACK)] * (p - rank - 1)
    for i in range(m - 2 * p + rank + 1):
        if i == 0 and rank == p - 1:
            tokens += [(_F, DOWN), (_B, BACK)]
        else:
            tokens.append(((_F, DOWN), (_B, BACK)))
        tokens.append(((_F, BACK), (_B, DOWN)))
    tokens += [(_B, BACK), ((_F, BACK), (_B, DOWN))] * (p - rank - 1)
    split = False
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        tokens.append((_BI if split else _B, BACK))
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        tokens.append((_BI if split else _B, DOWN))
    tokens += [(_W, None), (_BI, DOWN)] * (p - rank - 1)
    tokens += [(_W, None)] * (rank + 1)
    return tokens


def _number(tokens: List[Union[Token, Pair]], stages: Tuple[int, int],
            num_microbatches: int) -> List[Union[ComputeStep, Overlapped]]:
    """Give each token its microbatch; keep the steps of existing microbatches."""
    seen: Counter = Counter()
    pending: List[Tuple[int, int]] = []  # (chunk, microbatch) of input grads awaiting their weight grad

    def step(kind: ActionKind, chunk: Optional[int]) -> ComputeStep:
        if kind is _W:
            chunk, mb = next(item for item in pending if chunk is None or item[0] == chunk)
            pending.remove((chunk, mb))
        else:
            mb = seen[(kind is _F, chunk)]
            seen[(kind is _F, chunk)] += 1
            if kind is _BI:
                pending.append((chunk, mb))
        return kind, stages[chunk], mb

    order: List[Union[ComputeStep, Overlapped]] = []
    for token in tokens:
        group = tuple(step(*t) for t in token) if isinstance(token[0], tuple) else (step(*token),)
        kept = tuple(s for s in group if s[2] < num_microbatches)
        if len(kept) > 1:
            order.append(Overlapped(kept))
        elif kept:
            order.append(kept[0])
    return order


def build_zb_v(num_stages: int, num_microbatches: int, num_chunks: int) -> Schedule:
    """ZB-V on p = num_stages ranks, two chunks each.

    Raises:
        ValueError: num_chunks is not 2.
    """
    _require_two_chunks("zb_v", num_chunks)
    p, m = num_stages, num_microbatches
    padded = max(m, 2 * p - 1)
    orders = [_number(_zb_v_tokens(r, p, padded), (r, 2 * p - 1 - r), m) for r in range(p)]
    return assemble("zb_v", m, v_stage_to_rank(p), orders)


def build_dualpipe_v(num_stages: int, num_microbatches: int, num_chunks: int) -> Schedule:
    """DualPipeV on p = num_stages ranks, two chunks each.

    Raises:
        ValueError: num_chunks is not 2, or num_microbatches < 2p (its phases need them).
    """
    _require_two_chunks("dualpipe_v", num_chunks)
    p, m = num_stages, num_microbatches
    if m < 2 * p:
        raise ValueError(f"num_microbatches={m}: 'dualpipe_v' needs at least 2 * num_stages = {2 * p} microbatches")
    orders = [_number(_dualpipe_v_tokens(r, p, m), (r, 2 * p - 1 - r), m) for r in range(p)]
    return assemble("dualpipe_v", m, v_stage_to_rank(p), orders)
