"""Published pipeline-bubble formulas, the reference the simulation is checked against.

p ranks, m microbatches, v chunks per rank. F, B, W are the times one microbatch spends in a
rank's whole share of the model for the forward, the input gradient and the weight gradient, so
one chunk action costs F/v (B/v, W/v) and a full backward B+W.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

__all__ = ["BubbleFormula", "BUBBLE_FORMULAS", "published_idle", "bubble_fraction"]


@dataclass(frozen=True)
class BubbleFormula:
    """The published idle time per rank of one schedule family.

    Attributes:
        text: the formula as printed.
        measure: "step" (idle within the step's makespan, every rank) or "span" (idle between a
            rank's own first and last action: the zero-bubble papers' measure, where no sync at
            the step boundary lets ranks run one forward apart).
        source: where it is published and under which condition.
    """

    text: str
    measure: str
    source: str


BUBBLE_FORMULAS: Dict[str, BubbleFormula] = {
    "gpipe": BubbleFormula("(p-1)(F+B+W)", "step", "Huang et al. 2019 (GPipe); Narayanan et al. 2021"),
    "1f1b": BubbleFormula("(p-1)(F+B+W)", "step", "Narayanan et al. 2021 (PipeDream-flush / 1F1B)"),
    "interleaved_1f1b": BubbleFormula("(p-1)(F+B+W)/v", "step", "Narayanan et al. 2021, m a multiple of p"),
    "zb_h1": BubbleFormula("(p-1)(F+B-W)", "step", "Qi et al. 2023 (Zero Bubble), W <= F+B"),
    "zb_v": BubbleFormula("0", "span", "Qi et al. 2024 (Controllable Memory), F=B=W and m >= 2p"),
    "dualpipe_v": BubbleFormula("(PP/2-1)(F&B+B-3W)", "step",
                                "DeepSeek DualPipe README, per chunk with PP = 2p stages; F&B = F+B here (nothing to "
                                "overlap), full backward B; holds for chunk forward = input-gradient time >= W"),
}


def published_idle(kind: str, num_stages: int, num_chunks: int = 1, forward: float = 1.0,
                   backward_input: float = 1.0, backward_weight: float = 1.0) -> float:
    """Idle time per rank by the published formula of `kind` (see BUBBLE_FORMULAS for its measure).

    Args:
        kind: a key of BUBBLE_FORMULAS.
        num_stages: p.
        num_chunks: v (used by interleaved_1f1b).
        forward, backward_input, backward_weight: F, B, W per microbatch for a rank's whole share.

    Raises:
        ValueError: unknown kind.
    """
    p, f, b, w = num_stages, forward, backward_input, backward_weight
    if kind in ("gpipe", "1f1b"):
        return (p - 1) * (f + b + w)
    if kind == "interleaved_1f1b":
        return (p - 1) * (f + b + w) / num_chunks
    if kind == "zb_h1":
        return (p - 1) * (f + b - w)
    if kind == "zb_v":
        return 0.0
    if kind == "dualpipe_v":
        # per chunk: forward F/2, full backward (B+W)/2, weight W/2, and F&B = forward + full backward
        chunk_f, chunk_b, chunk_w = f / 2, (b + w) / 2, w / 2
        return (p - 1) * ((chunk_f + chunk_b) + chunk_b - 3 * chunk_w)
    raise ValueError(f"kind={kind!r}: expected one of {list(BUBBLE_FORMULAS)}")


def bubble_fraction(idle: float, num_microbatches: int, forward: float = 1.0, backward_input: float = 1.0,
                    backward_weight: float = 1.0) -> float:
    """Idle over idle + work for a rank that computes m microbatches of F + B + W."""
    work = num_microbatches * (forward + backward_input + backward_weight)
    return idle / (idle + work)
