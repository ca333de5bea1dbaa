"""The encoder pipeline on virtual groups in one process: every compute runs for real (numerics),
its duration is measured (or priced by a cost model), and an event-driven clock places it on its
group's timeline as separate devices would run it."""
from __future__ import annotations

import heapq
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from mindspore_hyper.multimodal.requests import Batch, EncodedBatch
from mindspore_hyper.multimodal.schedule_rules import assign, may_start
from mindspore_hyper.multimodal.stages import EncoderStage, LanguageStage
from mindspore_hyper.multimodal.encoder_timeline import LM_GROUP, encoder_group, stage_span
from mindspore_hyper.schedule.span import Span

__all__ = ["run_simulated"]


def _timed(cost_model: Optional[Callable], kind: str, batch: Batch, fn: Callable):
    """Runs fn; its seconds are measured, or priced by cost_model(kind, batch, rows) where rows is
    the number of images the encoder really ran (cache hits excluded) or the batch size."""
    start = time.perf_counter()
    result = fn()
    measured = time.perf_counter() - start
    if cost_model is None:
        return result, measured
    rows = sum(r is None for r in result.reused_from) if kind == "encode" else batch.size
    return result, float(cost_model(kind, batch, rows))


def run_simulated(batches: Sequence[Batch], encoders: List[EncoderStage], lm: LanguageStage, ahead: int,
                  cost_model: Optional[Callable] = None, loss_fn: Optional[Callable] = None):
    """Runs the stream; returns (per-batch LM results, per-batch encoder grads, events).

    LM results are (outputs, reused_from) (inference) or (loss, feature grad, lm grads) (training,
    `loss_fn` given).
    """
    training = loss_fn is not None
    by_id = {b.batch_id: b for b in batches}
    queues = assign(batches, len(encoders))
    n = len(encoders)
    started, taken, finished = [0] * n, [0] * n, [0] * n
    encoder_free = [True] * n
    backward_todo: List[List[Tuple[int, object]]] = [[] for _ in range(n)]
    lm_free = True
    ready: List[Tuple[float, int, EncodedBatch]] = []  # completion order
    pending: List[tuple] = []  # (time, seq, kind, encoder, payload)
    seq = 0
    now = 0.0
    events: List[Span] = []
    lm_results: Dict[int, object] = {}
    encoder_grads: Dict[int, list] = {}
    woken = set()

    def push(t, kind, e, payload):
        nonlocal seq
        heapq.heappush(pending, (t, seq, kind, e, payload))
        seq += 1

    def start_lm():
        nonlocal lm_free
        if not lm_free or not ready:
            return
        _, _, encoded = heapq.heappop(ready)
        batch = by_id[encoded.batch_id]
        taken[encoded.encoder] += 1
        if training:
            result, d = _timed(cost_model, "lm", batch, lambda: lm.train(encoded, batch, loss_fn))
        else:
            result, d = _timed(cost_model, "lm", batch, lambda: (lm.infer(encoded, batch), encoded.reused_from))
        lm_free = False
        events.append(stage_span(LM_GROUP, "lm", batch.batch_id, now, now + d))
        push(now + d, "lm_done", encoded.encoder, (batch, result))

    def start_encoders():
        for e in range(n):
            if not encoder_free[e]:
                continue
            if backward_todo[e]:
                batch_id, feature_grad = backward_todo[e].pop(0)
                batch = by_id[batch_id]
                grads, d = _timed(cost_model, "encoder_backward", batch,
                                  lambda: encoders[e].backward(batch_id, feature_grad))
                encoder_grads[batch_id] = grads
                events.append(stage_span(encoder_group(e), "encoder_backward", batch_id, now, now + d))
                encoder_free[e] = False
                push(now + d, "encoder_free", e, None)
                continue
            if started[e] == len(queues[e]) or not may_start(ahead, started[e], taken[e], finished[e]):
                continue
            batch = queues[e][started[e]]
            if batch.arrival > now:
                if batch.batch_id not in woken:
                    woken.add(batch.batch_id)
                    push(batch.arrival, "arrival", e, None)
                continue
            stage = encoders[e]
            fn = (lambda: stage.forward_for_training(batch)) if training else (lambda: stage.encode(batch))
            encoded, d = _timed(cost_model, "encode", batch, fn)
            started[e] += 1
            encoder_free[e] = False
            events.append(stage_span(encoder_group(e), "encode", batch.batch_id, now, now + d))
            push(now + d, "encoded", e, encoded)

    while True:
        start_lm()
        start_encoders()
        start_lm()
        if not pending:
            break
        now, _, kind, e, payload = heapq.heappop(pending)
        if kind == "encoded":
            encoder_free[e] = True
            heapq.heappush(ready, (now, payload.batch_id, payload))
        elif kind == "encoder_free":
            encoder_free[e] = True
        elif kind == "lm_done":
            lm_free = True
            batch, result = payload
            finished[e] += 1
            lm_results[batch.batch_id] = result
            if training:
                _loss, feature_grad, _grads = result
                backward_todo[e].append((batch.batch_id, feature_grad))
    if len(lm_results) != len(batches) or (training and len(encoder_grads) != len(batches)):
        raise RuntimeError(f"encoder pipeline simulation stopped with {len(lm_results)} of {len(batches)} "
                           f"batches done (internal scheduling error)")
    return lm_results, encoder_grads, events
