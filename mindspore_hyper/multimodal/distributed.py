"""The encoder pipeline across processes of an msrun job (one process per group member).

The world is split into an encoder group (`encoder_ranks`, one encoder replica per process) and
an LM group (one process, `lm_rank`); other ranks idle. Every process calls the pipeline with the
same batches. Encoder e encodes its round-robin share and sends each encoded batch to the LM
(`p2p.Channel`); it starts a batch only when `schedule_rules.may_start` allows it, counting the
TAKEN / DONE messages the LM sends back (back-pressure). The LM has one receiver thread per
encoder feeding one queue, so it takes batches in the order they arrive (completion order). For
training, DONE carries the gradient of the features and the encoder runs its backward when it
arrives; encoder gradients are summed over the encoder group (all-reduce), LM gradients stay on
the LM process: each process trains `local_parameters()`.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np

from mindspore_hyper.multimodal.request_transport import DONE, END, FEATURES, REPORT, TAKEN, Channel, StageMessage
from mindspore_hyper.multimodal.requests import Batch, EncodedBatch
from mindspore_hyper.multimodal.results import (PipelineResult, TrainResult, inference_result, make_timeline,
                                                sum_in_batch_order)
from mindspore_hyper.multimodal.schedule_rules import assign, may_start
from mindspore_hyper.multimodal.stages import EncoderStage, LanguageStage
from mindspore_hyper.multimodal.encoder_timeline import LM_GROUP, encoder_group, stage_span
from mindspore_hyper.schedule.span import Span

__all__ = ["GroupSplit", "run_distributed"]

_STATS = ("hits", "misses", "candidates_checked", "rejected", "inserts", "evictions")


@dataclass
class GroupSplit:
    """Which world ranks encode and which one runs the LM; the channels between them."""

    encoder_ranks: Tuple[int, ...]
    lm_rank: int
    world: object

    @classmethod
    def make(cls, num_encoders: int, encoder_ranks: Optional[Sequence[int]], lm_rank: Optional[int]) -> "GroupSplit":
        """Validates the split against the msrun world.

        Raises:
            ValueError: too few processes, overlapping or out-of-range ranks, or the MindSpore
                transport (its CPU backend has no point-to-point send/recv).
        """
        from mindspore_hyper.runtime.distributed.world import world

        w = world()
        if w.transport != "shm":
            raise ValueError(f"dist_transport={w.transport!r}: the encoder pipeline sends point-to-point messages, "
                             f"which only the 'shm' transport provides (MindSpore's CPU backend has no send/recv)")
        encoders = tuple(range(num_encoders)) if encoder_ranks is None else tuple(int(r) for r in encoder_ranks)
        lm = num_encoders if lm_rank is None else int(lm_rank)
        if len(encoders) != num_encoders:
            raise ValueError(f"encoder_ranks: {len(encoders)} ranks given for num_encoders={num_encoders}")
        if len(set(encoders)) != len(encoders) or lm in encoders:
            raise ValueError(f"encoder_ranks {encoders} and lm_rank {lm} must be distinct ranks")
        for r in encoders + (lm,):
            if not 0 <= r < w.size:
                raise ValueError(f"rank {r} of the encoder/LM split is outside the job of {w.size} processes: "
                                 f"launch msrun with --worker_num >= {max(encoders + (lm,)) + 1}")
        return cls(encoders, lm, w)

    def role(self) -> str:
        me = self.world.rank
        return "lm" if me == self.lm_rank else "encoder" if me in self.encoder_ranks else "idle"

    def channels(self) -> Dict[Tuple[int, int], Channel]:
        """Channels of this process: (source, target) -> Channel (the rank's channel pool makes
        each pair's channel once, collectively)."""
        me, chans = self.world.rank, {}
        for e in self.encoder_ranks:
            if me in (e, self.lm_rank):
                for src, dst in ((e, self.lm_rank), (self.lm_rank, e)):
                    chans[(src, dst)] = Channel(self.world.job, src, dst, me, self.world.timeout)
        return chans


def _receiver(channel: Channel, tag: int, out: queue.Queue) -> threading.Thread:
    """A thread moving messages from `channel` into `out` as (tag, message) until END (or an error)."""

    def loop():
        try:
            while True:
                msg = channel.recv()
                out.put((tag, msg))
                if msg.kind == END:
                    return
        except Exception as exc:  # the consumer re-raises it, naming the channel's world ranks
            message = f"encoder pipeline: receiving on world ranks {channel.source} -> {channel.target}: {exc}"
            try:
                wrapped = type(exc)(message)
            except Exception:
                wrapped = RuntimeError(message)
            wrapped.__cause__ = exc
            out.put((tag, wrapped))

    thread = threading.Thread(target=loop, name=f"mm-recv-{channel.source}", daemon=True)
    thread.start()
    return thread


def _get(inbox: queue.Queue, timeout: float, waiting_for: str):
    try:
        tag, msg = inbox.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"encoder pipeline: no message for {timeout} s while waiting for {waiting_for}") from None
    if isinstance(msg, Exception):
        raise msg
    return tag, msg


def run_distributed(pipe, batches: List[Batch], loss_fn: Optional[Callable]):
    """This process's part of the run (see module docstring); returns a PipelineResult or TrainResult."""
    split: GroupSplit = pipe._groups
    w = split.world
    w.communicator(tuple(range(w.size))).barrier()
    origin = time.time()
    shifted = [Batch(b.batch_id, b.request_ids, b.images, b.text, b.labels, origin + b.arrival) for b in batches]
    role = split.role()
    training = loss_fn is not None
    if role == "encoder":
        index = split.encoder_ranks.index(w.rank)
        events, grads, stats = _encoder_loop(pipe, split, index, assign(shifted, pipe.num_encoders)[index], training)
        if training:
            flat = _all_reduce_grads(split, grads, pipe.encoder.trainable_params())
            return TrainResult({}, tuple(ms.Tensor(g) for g in flat), make_timeline(shifted, events))
        return PipelineResult({}, {}, make_timeline(shifted, events), stats)
    if role == "lm":
        results, events, stats = _lm_loop(pipe, split, shifted, loss_fn)
        if training:
            losses = {b: r[0] for b, r in results.items()}
            grads = sum_in_batch_order({b: r[2] for b, r in results.items()})
            return TrainResult(losses, tuple(ms.Tensor(g) for g in grads), make_timeline(shifted, events))
        return inference_result(shifted, results, events, stats)
    return TrainResult({}, (), make_timeline(shifted, [])) if training else \
        PipelineResult({}, {}, make_timeline(shifted, []), None)


def _encoder_loop(pipe, split: GroupSplit, index: int, mine: List[Batch], training: bool):
    me = split.world.rank
    chans = split.channels()
    to_lm, from_lm = chans[(me, split.lm_rank)], chans[(split.lm_rank, me)]
    inbox: queue.Queue = queue.Queue()
    thread = _receiver(from_lm, 0, inbox)
    stage = EncoderStage(pipe.encoder, None if training else pipe.cache, pipe.signature, index)
    started = taken = finished = 0
    events: List[Span] = []
    grads: Dict[int, list] = {}
    group = encoder_group(index)

    def handle(msg: StageMessage):
        nonlocal taken, finished
        if msg.kind == TAKEN:
            taken += 1
        elif msg.kind == DONE:
            finished += 1
            if training:
                start = time.time()
                grads[msg.batch_id] = stage.backward(msg.batch_id, msg.array)
                events.append(stage_span(group, "encoder_backward", msg.batch_id, start, time.time()))
        else:
            raise RuntimeError(f"encoder {index}: unexpected {msg.kind_name!r} message from the LM")

    for batch in mine:
        while True:  # finished batches' backwards first, then wait for room
            try:
                handle(_poll(inbox))
            except queue.Empty:
                if may_start(pipe.ahead, started, taken, finished):
                    break
                handle(_get(inbox, split.world.timeout, f"the LM to take a batch of encoder {index}")[1])
        delay = batch.arrival - time.time()
        if delay > 0:
            time.sleep(delay)
        start = time.time()
        encoded = stage.forward_for_training(batch) if training else stage.encode(batch)
        end = time.time()
        events.append(stage_span(group, "encode", batch.batch_id, start, end))
        keys = [-1 if k is None else _int_key(k) for k in encoded.reused_from]
        to_lm.send(StageMessage(FEATURES, batch.batch_id, list(batch.request_ids) + keys, [start, end],
                                encoded.features))
        started += 1
    while finished < len(mine):
        handle(_get(inbox, split.world.timeout, f"the LM to finish the batches of encoder {index}")[1])
    stats = stage.cache.stats.to_dict() if stage.cache is not None else None
    backward = [e for e in events if e.kind == "encoder_backward"]  # the LM has the encode times
    to_lm.send(StageMessage(REPORT, -1, [e.args["batch"] for e in backward],
                            [v for e in backward for v in (e.start, e.end)],
                            None if stats is None else np.array([stats[k] for k in _STATS], np.float32)))
    to_lm.send(StageMessage(END))
    _, msg = _get(inbox, split.world.timeout, "the LM's end of stream")
    if msg.kind != END:
        raise RuntimeError(f"encoder {index}: expected the LM's end of stream, got {msg.kind_name!r}")
    thread.join()
    return events, grads, stats


def _poll(inbox: queue.Queue) -> StageMessage:
    tag, msg = inbox.get_nowait()
    if isinstance(msg, Exception):
        raise msg
    return msg


def _int_key(key) -> int:
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool) and key >= 0:
        return int(key)
    raise ValueError(f"cache key {key!r}: in distributed mode cache keys must be ints >= 0 (request ids)")


def _lm_loop(pipe, split: GroupSplit, batches: List[Batch], loss_fn: Optional[Callable]):
    me = split.world.rank
    chans = split.channels()
    by_id = {b.batch_id: b for b in batches}
    inbox: queue.Queue = queue.Queue()
    threads = [_receiver(chans[(e, me)], i, inbox) for i, e in enumerate(split.encoder_ranks)]
    stage = LanguageStage(pipe.lm)
    results: Dict[int, tuple] = {}
    events: List[Span] = []
    stats_sum, ended = None, 0
    while ended < len(split.encoder_ranks):
        tag, msg = _get(inbox, split.world.timeout, "encoded batches")
        to_encoder = chans[(me, split.encoder_ranks[tag])]
        if msg.kind == FEATURES:
            batch = by_id[msg.batch_id]
            n = batch.size
            if tuple(int(r) for r in msg.ids[:n]) != batch.request_ids:
                raise RuntimeError(f"batch {msg.batch_id}: request ids {msg.ids[:n].tolist()} from encoder {tag} "
                                   f"do not match the stream's {list(batch.request_ids)}")
            reused = tuple(None if k < 0 else int(k) for k in msg.ids[n:])
            events.append(stage_span(encoder_group(tag), "encode", msg.batch_id, msg.values[0], msg.values[1]))
            encoded = EncodedBatch(msg.batch_id, batch.request_ids, msg.array, reused, tag)
            start = time.time()  # before TAKEN: an encoder's next start is never before it (tested)
            to_encoder.send(StageMessage(TAKEN, msg.batch_id))
            if loss_fn is None:
                results[msg.batch_id] = (stage.infer(encoded, batch), reused)
                done = StageMessage(DONE, msg.batch_id)
            else:
                loss, feature_grad, grads = stage.train(encoded, batch, loss_fn)
                results[msg.batch_id] = (loss, None, grads)
                done = StageMessage(DONE, msg.batch_id, array=feature_grad)
            events.append(stage_span(LM_GROUP, "lm", msg.batch_id, start, time.time()))
            to_encoder.send(done)
        elif msg.kind == REPORT:
            events += [stage_span(encoder_group(tag), "encoder_backward", int(b), float(s), float(e))
                       for b, (s, e) in zip(msg.ids, msg.values.reshape(-1, 2))]
            if msg.array is not None:
                stats_sum = msg.array.astype(np.float64) + (0 if stats_sum is None else stats_sum)
        elif msg.kind == END:
            ended += 1
        else:
            raise RuntimeError(f"LM: unexpected {msg.kind_name!r} message from encoder {tag}")
    for e in split.encoder_ranks:
        chans[(me, e)].send(StageMessage(END))
    for t in threads:
        t.join()
    if len(results) != len(batches):
        raise RuntimeError(f"LM: {len(results)} of {len(batches)} batches arrived before the encoders ended")
    stats = None
    if stats_sum is not None:
        stats = {k: int(v) for k, v in zip(_STATS, stats_sum)}
        stats["hit_rate"] = stats["hits"] / max(1, stats["hits"] + stats["misses"])
    return results, events, stats


def _all_reduce_grads(split: GroupSplit, grads: Dict[int, list], params) -> List[np.ndarray]:
    """This encoder's gradients summed in batch order, then over the encoder group."""
    local = sum_in_batch_order(grads)
    if not local:
        local = [np.zeros(p.shape, np.float32) for p in params]  # an encoder without batches
    if len(split.encoder_ranks) == 1:
        return local
    flat = np.concatenate([g.ravel() for g in local]).astype(np.float32)
    total = split.world.communicator(split.encoder_ranks).all_reduce(flat)
    out, offset = [], 0
    for g in local:
        out.append(total[offset:offset + g.size].reshape(g.shape))
        offset += g.size
    return out
