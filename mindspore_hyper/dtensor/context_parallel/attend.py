"""`attend`: attention by the strategy's context-parallel method."""
from __future__ import annotations

from mindspore_hyper.dtensor.context_parallel import ring, ulysses
from mindspore_hyper.dtensor.context_parallel.scores import AttentionScores
from mindspore_hyper.dtensor.dtensor import DTensor

__all__ = ["attend"]


def attend(execution, scores: AttentionScores, value: DTensor) -> DTensor:
    """softmax(steps(q @ k^T)) @ value by the strategy's context-parallel method.

    Args:
        execution: the run (its `context_parallel` names the axis and method).
        scores: the probabilities' expression (`softmax` True).
        value: V [..., s, dv].

    Returns:
        The attention output [..., t, dv], sharded like q along the sequence.

    Raises:
        ValueError: the method's divisibility conditions fail (sizes named).
    """
    if execution.context_parallel.method == "ulysses":
        return ulysses.attention(execution, scores, value)
    return ring.attention(execution, scores, value)
