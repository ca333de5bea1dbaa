"""What a run of the encoder pipeline returns (both modes): inference and training results, and
the helpers that assemble them from per-batch results."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np

from mindspore_hyper.multimodal.requests import Batch
from mindspore_hyper.multimodal.encoder_timeline import EncoderTimeline

__all__ = ["PipelineResult", "TrainResult", "inference_result", "make_timeline", "sum_in_batch_order"]


@dataclass
class PipelineResult:
    """Inference results.

    Attributes:
        outputs: request id -> the LM's output row for that request.
        reused_from: request id -> the cache key whose feature it reused (cache hits only).
        timeline: when each group computed what (virtual or measured seconds).
        cache_stats: the feature cache's counters since it was made (distributed: summed over
            the encoder processes' caches, on the LM process), or None without a cache.
    """

    outputs: Dict[int, np.ndarray]
    reused_from: Dict[int, Any]
    timeline: EncoderTimeline
    cache_stats: Optional[Dict[str, float]] = None


@dataclass
class TrainResult:
    """One training step over a list of batches.

    Attributes:
        losses: batch id -> loss of that batch.
        grads: gradients aligned with `AsyncEncoderPipeline.local_parameters()` (in simulation all
            parameters: the encoder's, then the LM's), each summed over the batches in batch order.
        timeline: as in PipelineResult.
    """

    losses: Dict[int, float]
    grads: Tuple[ms.Tensor, ...]
    timeline: EncoderTimeline

    @property
    def loss(self) -> float:
        return float(sum(self.losses[b] for b in sorted(self.losses)))


def inference_result(batches: Sequence[Batch], results: Dict[int, tuple], events, cache_stats) -> PipelineResult:
    """Per-request outputs from per-batch (outputs, reused_from)."""
    per_request, reused = {}, {}
    for b in batches:
        out, reuse = results[b.batch_id]
        for i, rid in enumerate(b.request_ids):
            per_request[rid] = out[i]
            if reuse[i] is not None:
                reused[rid] = reuse[i]
    return PipelineResult(per_request, reused, make_timeline(batches, events), cache_stats)


def make_timeline(batches: Sequence[Batch], spans) -> EncoderTimeline:
    """The run's EncoderTimeline: the spans with the batches' arrivals and sizes."""
    return EncoderTimeline(spans, {b.batch_id: b.arrival for b in batches}, {b.batch_id: b.size for b in batches})


def sum_in_batch_order(per_batch: Dict[int, List[np.ndarray]]) -> List[np.ndarray]:
    """Element-wise sums of per-batch gradient lists, added in batch-id order (deterministic)."""
    total = None
    for batch_id in sorted(per_batch):
        grads = per_batch[batch_id]
        total = [g.copy() for g in grads] if total is None else [t + g for t, g in zip(total, grads)]
    return total if total is not None else []
