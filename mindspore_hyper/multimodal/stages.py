"""The real computations of one batch, shared by the simulated and the distributed runner:
the encoder stage (cache lookups, encoder forward, encoder backward) and the language-model stage
(inference, or loss with the gradients of its parameters and of the features)."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import mindspore as ms
import numpy as np

from mindspore_hyper.autodiff import grad, value_and_grad
from mindspore_hyper.multimodal.requests import Batch, EncodedBatch

__all__ = ["EncoderStage", "LanguageStage"]


def _numpy(t) -> np.ndarray:
    return t.asnumpy() if hasattr(t, "asnumpy") else np.asarray(t)


class EncoderStage:
    """Encodes batches on one encoder replica.

    Args:
        encoder: nn.Cell mapping (B, C, H, W) float32 images to (B, ...) features.
        cache: a FeatureCache (inference only) or None.
        signature: image -> signature vector for the cache.
        index: this replica's index (recorded in EncodedBatch.encoder).
    """

    def __init__(self, encoder, cache=None, signature: Callable = None, index: int = 0):
        self.encoder = encoder
        self.cache = cache
        self.signature = signature
        self.index = index
        self._inputs: Dict[int, np.ndarray] = {}

    def encode(self, batch: Batch) -> EncodedBatch:
        """Inference: cached features for near-duplicates, the encoder for the rest (one call)."""
        n = batch.size
        reused: List[Optional[object]] = [None] * n
        rows: List[Optional[np.ndarray]] = [None] * n
        signatures = []
        if self.cache is not None:
            for i in range(n):
                sig = self.signature(batch.images[i])
                signatures.append(sig)
                match = self.cache.match(sig)
                if match is not None:
                    rows[i], reused[i] = match.feature, match.key
        misses = [i for i in range(n) if rows[i] is None]
        if misses:
            features = _numpy(self.encoder(ms.Tensor(np.ascontiguousarray(batch.images[misses]))))
            for j, i in enumerate(misses):
                rows[i] = features[j]
                if self.cache is not None:
                    self.cache.insert(signatures[i], features[j], key=batch.request_ids[i])
        return EncodedBatch(batch.batch_id, batch.request_ids, np.stack(rows).astype(np.float32, copy=False),
                            tuple(reused), self.index)

    def forward_for_training(self, batch: Batch) -> EncodedBatch:
        """Training forward; keeps the batch's images for `backward(batch_id, ...)`."""
        self._inputs[batch.batch_id] = batch.images
        out = self.encoder(ms.Tensor(batch.images))
        return EncodedBatch(batch.batch_id, batch.request_ids, _numpy(out), (None,) * batch.size, self.index)

    def backward(self, batch_id: int, feature_grad: np.ndarray) -> List[np.ndarray]:
        """Gradients of the encoder parameters from the features' gradient of `batch_id`: the
        gradient of <encoder(images), feature_grad>, which recomputes the forward (activation
        recomputation: MindSpore's PyNative keeps one pending graph per grad call, so graphs of
        batches still in flight cannot be held). The encoder must be deterministic (no dropout)."""
        images = ms.Tensor(self._inputs.pop(batch_id))
        cotangent = ms.Tensor(feature_grad)
        encoder = self.encoder

        def weighted(x):
            return (encoder(x) * cotangent).sum()

        grads = grad(weighted, grad_position=None, weights=encoder.trainable_params())(images)
        return [_numpy(g) for g in grads]


class LanguageStage:
    """Runs the language model on encoded batches.

    Args:
        lm: nn.Cell taking (features, text) and returning (B, ...) per-request outputs.
    """

    def __init__(self, lm):
        self.lm = lm

    def infer(self, encoded: EncodedBatch, batch: Batch) -> np.ndarray:
        return _numpy(self.lm(ms.Tensor(encoded.features), ms.Tensor(batch.text)))

    def train(self, encoded: EncodedBatch, batch: Batch, loss_fn: Callable) -> Tuple[float, np.ndarray, List[np.ndarray]]:
        """Loss, gradient of the features, gradients of the LM parameters (in trainable_params order)."""
        if batch.labels is None:
            raise ValueError(f"batch {batch.batch_id}: training needs labels")
        lm = self.lm

        def loss_of(features, text, labels):
            return loss_fn(lm(features, text), labels)

        grad_fn = value_and_grad(loss_of, grad_position=0, weights=lm.trainable_params())
        loss, (feature_grad, weight_grads) = grad_fn(ms.Tensor(encoded.features), ms.Tensor(batch.text),
                                                     ms.Tensor(batch.labels))
        return float(_numpy(loss)), _numpy(feature_grad), [_numpy(g) for g in weight_grads]
