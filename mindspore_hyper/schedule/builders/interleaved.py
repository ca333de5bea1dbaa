"""Interleaved 1F1B (Megatron-LM's virtual pipeline): v model chunks per rank, stage s on rank s % p.

Each rank walks its m*v forward passes in groups of p microbatches per chunk (chunk 0 for
microbatches 0..p-1, chunk 1 for the same microbatches, ..., then the next p microbatches), and
its backward passes the same way from the last chunk down. Rank r first runs
(p-r-1)*2 + (v-1)*p warm-up forwards (all m*v of them when m == p), then alternates one forward
and one backward, then drains. The bubble is (p-1)(F+B+W)/v for per-rank costs F, B, W.
"""
from __future__ import annotations

from typing import List

from mindspore_hyper.schedule.actions import ActionKind
from mindspore_hyper.schedule.builders.common import ComputeStep, assemble
from mindspore_hyper.schedule.schedule import Schedule

__all__ = ["build_interleaved_1f1b", "interleaved_warmup"]


def interleaved_warmup(num_stages: int, num_microbatches: int, num_chunks: int, rank: int) -> int:
    """Megatron-LM's number of warm-up forwards on `rank`: (p-rank-1)*2 + (v-1)*p, at most m*v."""
    total = num_microbatches * num_chunks
    if num_microbatches == num_stages:
        return total
    return min((num_stages - rank - 1) * 2 + (num_chunks - 1) * num_stages, total)


def build_interleaved_1f1b(num_stages: int, num_microbatches: int, num_chunks: int) -> Schedule:
    """Interleaved 1F1B on p = num_stages ranks with v = num_chunks chunks each.

    Raises:
        ValueError: num_chunks < 2, or num_microbatches not a multiple of num_stages (Megatron-LM
            processes microbatches in groups of p per chunk, so it requires m % p == 0).
    """
    p, m, v = num_stages, num_microbatches, num_chunks
    if v < 2:
        raise ValueError(f"num_chunks={v}: 'interleaved_1f1b' needs num_chunks >= 2 model chunks per rank "
                         f"(with one chunk it is '1f1b')")
    if m % p:
        raise ValueError(f"num_microbatches={m}: 'interleaved_1f1b' needs a multiple of num_stages={p} "
                         f"(Megatron-LM's requirement: microbatches run in groups of p per model chunk)")
    stage_to_rank = tuple(s % p for s in range(p * v))
    orders = []
    for rank in range(p):
        def step(kind: ActionKind, k: int, chunk: int) -> ComputeStep:
            return kind, chunk * p + rank, (k // (p * v)) * p + k % p

        forwards = [step(ActionKind.FORWARD, k, (k // p) % v) for k in range(m * v)]
        backwards = [step(ActionKind.BACKWARD, k, v - 1 - (k // p) % v) for k in range(m * v)]
        warmup = interleaved_warmup(p, m, v, rank)
        order: List[ComputeStep] = forwards[:warmup]
        for k in range(m * v - warmup):
            order += [forwards[warmup + k], backwards[k]]
        order += backwards[m * v - warmup:]
        orders.append(order)
    return assemble("interleaved_1f1b", m, stage_to_rank, orders)
