"""The rules both runners follow: which encoder encodes a batch, and when it may start one."""
from __future__ import annotations

from typing import Dict, List, Sequence

from mindspore_hyper.multimodal.requests import Batch

__all__ = ["assign", "may_start"]


def assign(batches: Sequence[Batch], num_encoders: int) -> Dict[int, List[Batch]]:
    """Round robin in stream order: the i-th batch goes to encoder i % num_encoders."""
    queues: Dict[int, List[Batch]] = {e: [] for e in range(num_encoders)}
    for i, batch in enumerate(batches):
        queues[i % num_encoders].append(batch)
    return queues


def may_start(ahead: int, started: int, taken: int, finished: int) -> bool:
    """Back-pressure of one encoder: with `ahead` >= 1 it holds at most `ahead` batches that the
    language model has not taken yet (encoding or queued); with `ahead` = 0 (synchronous) it
    starts a batch only after the language model finished all its previous ones."""
    if ahead == 0:
        return started == finished
    return started - taken < ahead
