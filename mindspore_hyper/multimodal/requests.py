"""Batches of multimodal requests and what the encoder group hands to the language model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

__all__ = ["Batch", "EncodedBatch"]


@dataclass(frozen=True)
class Batch:
    """Requests encoded together.

    Attributes:
        batch_id: unique id in the stream (also the dispatch order).
        request_ids: one unique id per request, in row order.
        images: (B, C, H, W) float32 pixels, one image per request.
        text: (B, L) int token ids, the language model's other input.
        labels: (B, ...) training targets, or None for inference.
        arrival: seconds from the stream's start at which the batch is available.
    """

    batch_id: int
    request_ids: Tuple[int, ...]
    images: np.ndarray
    text: np.ndarray
    labels: Optional[np.ndarray] = None
    arrival: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "request_ids", tuple(int(r) for r in self.request_ids))
        n = len(self.request_ids)
        if n == 0:
            raise ValueError(f"batch {self.batch_id}: request_ids is empty")
        if len(set(self.request_ids)) != n:
            raise ValueError(f"batch {self.batch_id}: request_ids has duplicates")
        if not isinstance(self.images, np.ndarray) or self.images.ndim != 4 or self.images.shape[0] != n:
            raise ValueError(f"batch {self.batch_id}: images must be a (B={n}, C, H, W) numpy array, "
                             f"got {getattr(self.images, 'shape', type(self.images))}")
        if not isinstance(self.text, np.ndarray) or self.text.ndim < 1 or self.text.shape[0] != n:
            raise ValueError(f"batch {self.batch_id}: text must be a numpy array with B={n} rows, "
                             f"got {getattr(self.text, 'shape', type(self.text))}")
        if self.labels is not None and (not isinstance(self.labels, np.ndarray) or self.labels.shape[0] != n):
            raise ValueError(f"batch {self.batch_id}: labels must be a numpy array with B={n} rows")
        if not self.arrival >= 0.0:
            raise ValueError(f"batch {self.batch_id}: arrival must be >= 0 seconds, got {self.arrival}")

    @property
    def size(self) -> int:
        return len(self.request_ids)


@dataclass(frozen=True)
class EncodedBatch:
    """The encoder group's output for one batch.

    Attributes:
        batch_id, request_ids: as in the Batch (row i belongs to request_ids[i]).
        features: (B, ...) float32 encoder features.
        reused_from: per request, the cache key whose feature it reused, or None if encoded.
        encoder: index of the encoder that produced it.
    """

    batch_id: int
    request_ids: Tuple[int, ...]
    features: np.ndarray
    reused_from: Tuple[Any, ...]
    encoder: int = 0
