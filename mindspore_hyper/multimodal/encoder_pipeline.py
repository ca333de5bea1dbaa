"""AsyncEncoderPipeline: vision encoders run up to `ahead` batches in advance of the language model.

The encoders (one or more replicas, the encoder group) and the language model (the LM group) run
on their own devices: virtual groups in one process (`mode="simulation"`), or processes of an
msrun job (`mode="distributed"`, see `distributed.py`). Each encoder holds at most `ahead` batches
the LM has not taken (a bounded queue: back-pressure); the LM takes whichever encoded batch is
ready first, so a slow batch on one encoder does not stall ready work of another; results are
returned per request id. `ahead=0` is the synchronous model (encode, then the LM, then the next
batch). For training, the LM's gradient of the features flows back to the encoder that made them;
the gradients of a step are summed in batch order, so they equal the synchronous model's.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import mindspore as ms

from mindspore_hyper.multimodal.requests import Batch
from mindspore_hyper.multimodal.results import (PipelineResult, TrainResult, inference_result, make_timeline,
                                                sum_in_batch_order)
from mindspore_hyper.multimodal.signature import image_signature
from mindspore_hyper.multimodal.stages import EncoderStage, LanguageStage
from mindspore_hyper.runtime.modes import runtime_for

__all__ = ["AsyncEncoderPipeline", "PipelineResult", "TrainResult"]

MODES = ("simulation", "distributed")


def _check_batches(batches: Sequence[Batch]) -> List[Batch]:
    batches = list(batches)
    if not batches:
        raise ValueError("batches: expected at least one Batch")
    seen_batches, seen_requests = set(), set()
    for b in batches:
        if not isinstance(b, Batch):
            raise ValueError(f"batches: expected Batch items, got {type(b).__name__}")
        if b.batch_id in seen_batches:
            raise ValueError(f"batches: batch_id {b.batch_id} appears twice")
        seen_batches.add(b.batch_id)
        dup = seen_requests.intersection(b.request_ids)
        if dup:
            raise ValueError(f"batches: request id {sorted(dup)[0]} appears in two batches")
        seen_requests.update(b.request_ids)
    return batches


class AsyncEncoderPipeline:
    """Asynchronous encoder -> language-model pipeline with an optional feature cache.

    Args:
        encoder: nn.Cell, (B, C, H, W) images -> (B, ...) features (e.g. ViT + projector).
        lm: nn.Cell, (features, text) -> (B, ...) per-request outputs.
        ahead: batches each encoder may run ahead of the LM (0 = synchronous).
        num_encoders: encoder replicas; batch i goes to replica i % num_encoders.
        cache: a FeatureCache consulted before encoding (inference only). In simulation one
            cache serves every replica; in distributed mode it is the cache of the encoder
            process that holds it (each encoder process passes its own).
        signature: image -> signature for the cache (default `image_signature`).
        mode: "simulation" or "distributed"; None reads the `mode` context flag.
        cost_model: simulation only: (kind, batch, rows) -> seconds replacing the measured
            duration of a compute (kind "encode", "lm" or "encoder_backward"; rows = images the
            encoder really ran, cache hits excluded, or the batch size); None measures.
        encoder_ranks, lm_rank: distributed only: the world ranks of the encoder group and of
            the LM (default: ranks 0..num_encoders-1 encode, rank num_encoders runs the LM).

    Raises:
        ValueError: a bad argument (named in the message).
    """

    def __init__(self, encoder, lm, ahead: int = 1, num_encoders: int = 1, cache=None,
                 signature: Callable = image_signature, mode: Optional[str] = None,
                 cost_model: Optional[Callable] = None, encoder_ranks: Optional[Sequence[int]] = None,
                 lm_rank: Optional[int] = None):
        if isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 0:
            raise ValueError(f"ahead: expected an int >= 0 (0 = synchronous), got {ahead!r}")
        if isinstance(num_encoders, bool) or not isinstance(num_encoders, int) or num_encoders < 1:
            raise ValueError(f"num_encoders: expected an int >= 1, got {num_encoders!r}")
        if mode is None:
            from mindspore_hyper.context import get_context

            mode = get_context("mode")
        runtime = runtime_for(mode)  # the one look-up of the mode: below, only the runtime is asked
        if runtime is None or not runtime.runs_op_by_op():
            raise ValueError(f"mode: the encoder pipeline runs in {MODES}, got {mode!r}")
        if cache is not None and not hasattr(cache, "match"):
            raise ValueError(f"cache: expected a FeatureCache, got {type(cache).__name__}")
        if not callable(signature):
            raise ValueError("signature: expected a callable image -> vector")
        if cost_model is not None and (not runtime.in_one_process() or not callable(cost_model)):
            raise ValueError("cost_model: a callable (kind, batch, rows) -> seconds, only in simulation mode "
                             "(distributed mode measures real processes)")
        if runtime.in_one_process() and (encoder_ranks is not None or lm_rank is not None):
            raise ValueError("encoder_ranks/lm_rank: only in distributed mode (simulation uses virtual groups)")
        self.encoder, self.lm = encoder, lm
        self.ahead, self.num_encoders, self.cache = ahead, num_encoders, cache
        self.runtime = runtime
        self.signature, self.cost_model = signature, cost_model
        self._groups = None
        if not runtime.in_one_process():
            from mindspore_hyper.multimodal.distributed import GroupSplit

            self._groups = GroupSplit.make(num_encoders, encoder_ranks, lm_rank)

    def parameters(self) -> List[ms.Parameter]:
        """Trainable parameters: the encoder's, then the LM's (the order of TrainResult.grads)."""
        return list(self.encoder.trainable_params()) + list(self.lm.trainable_params())

    def local_parameters(self) -> List[ms.Parameter]:
        """The parameters this process trains (the order of its TrainResult.grads): all of
        `parameters()` in simulation; under msrun the encoder's on encoder processes, the LM's on
        the LM process, none elsewhere."""
        role = self.role
        if role == "all":
            return self.parameters()
        if role == "encoder":
            return list(self.encoder.trainable_params())
        return list(self.lm.trainable_params()) if role == "lm" else []

    @property
    def role(self) -> str:
        """"all" in simulation; in distributed mode "encoder", "lm" or "idle" for this process."""
        return "all" if self._groups is None else self._groups.role()

    def infer(self, batches: Sequence[Batch]) -> PipelineResult:
        """Runs the batches through encoder(s) and LM. In distributed mode every process of the job
        calls it with the same batches; outputs are filled on the LM process (empty elsewhere)."""
        batches = _check_batches(batches)
        if self._groups is not None:  # one process per group (msrun)
            from mindspore_hyper.multimodal.distributed import run_distributed

            return run_distributed(self, batches, loss_fn=None)
        from mindspore_hyper.multimodal.simulated import run_simulated

        encoders = [EncoderStage(self.encoder, self.cache, self.signature, e) for e in range(self.num_encoders)]
        outputs, _, events = run_simulated(batches, encoders, LanguageStage(self.lm), self.ahead, self.cost_model)
        stats = self.cache.stats.to_dict() if self.cache is not None else None
        return inference_result(batches, outputs, events, stats)

    def train_step(self, batches: Sequence[Batch], loss_fn: Callable) -> TrainResult:
        """Forward and backward of every batch (encoders ahead of the LM as in inference); the
        gradients of the step's loss (the sum of the batches' losses) w.r.t. `parameters()`.
        Apply them with a MindSpore optimizer over `local_parameters()`: `optimizer(result.grads)`.

        Raises:
            ValueError: a cache is set (a reused feature has no gradient path to the encoder),
                a batch has no labels, or loss_fn is not callable.
        """
        if self.cache is not None:
            raise ValueError("cache: training cannot reuse cached features (they were computed with older "
                             "encoder weights and carry no gradient); build the pipeline without a cache")
        if not callable(loss_fn):
            raise ValueError("loss_fn: expected a callable (lm outputs, labels) -> scalar loss")
        batches = _check_batches(batches)
        for b in batches:
            if b.labels is None:
                raise ValueError(f"batches: batch {b.batch_id} has no labels; training needs them")
        if self._groups is not None:  # one process per group (msrun)
            from mindspore_hyper.multimodal.distributed import run_distributed

            return run_distributed(self, batches, loss_fn=loss_fn)
        from mindspore_hyper.multimodal.simulated import run_simulated

        encoders = [EncoderStage(self.encoder, None, self.signature, e) for e in range(self.num_encoders)]
        results, encoder_grads, events = run_simulated(batches, encoders, LanguageStage(self.lm), self.ahead,
                                                       self.cost_model, loss_fn)
        losses = {b: r[0] for b, r in results.items()}
        grads = sum_in_batch_order(encoder_grads) + sum_in_batch_order({b: r[2] for b, r in results.items()})
        return TrainResult(losses, tuple(ms.Tensor(g) for g in grads), make_timeline(batches, events))
