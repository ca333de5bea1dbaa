"""Point-to-point messages between two processes of an msrun job: a tagged request (kind, batch
id, request ids or keys, float values such as timestamps, an optional float32 array) over a
one-directional shared-memory channel.

The HyperMPMD process-group runtime (runtime/mpmd/) is not available yet, so the encoder pipeline
brings its own transport: each directed pair of ranks gets its own two-member `ShmCommunicator`, so one
thread sends and one thread receives on it without sharing a communicator between threads. A
message is a fixed int64 header, then its parts (the header says their sizes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

__all__ = ["Message", "Channel", "FEATURES", "TAKEN", "DONE", "REPORT", "END"]

FEATURES, TAKEN, DONE, REPORT, END = 1, 2, 3, 4, 5
_KINDS = {FEATURES: "features", TAKEN: "taken", DONE: "done", REPORT: "report", END: "end"}
_MAX_DIMS = 8
_HEADER = 6 + _MAX_DIMS  # kind, batch_id, n_ids, n_values, ndim (-1: no array), pad, dims


@dataclass
class Message:
    """One request between processes.

    Attributes:
        kind: FEATURES (encoder -> LM), TAKEN / DONE (LM -> encoder), REPORT (events and cache
            statistics, encoder -> LM), END (no more messages on this channel).
        batch_id: the batch it concerns (-1 if none).
        ids: int64 values (request ids, reused-entry keys with -1 for none, ...).
        values: float64 values (timestamps, statistics).
        array: a float32 array (features, feature gradients) or None.
    """

    kind: int
    batch_id: int = -1
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    array: Optional[np.ndarray] = None

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"kind: expected one of {sorted(_KINDS)}, got {self.kind!r}")
        self.ids = np.ascontiguousarray(self.ids, dtype=np.int64).ravel()
        self.values = np.ascontiguousarray(self.values, dtype=np.float64).ravel()
        if self.array is not None:
            self.array = np.ascontiguousarray(self.array, dtype=np.float32)
            if self.array.ndim > _MAX_DIMS:
                raise ValueError(f"array: at most {_MAX_DIMS} dimensions, got {self.array.ndim}")

    @property
    def kind_name(self) -> str:
        return _KINDS[self.kind]


class Channel:
    """One direction between this process and `peer` (global ranks), over its own ShmCommunicator.

    Both ends construct it (in the same order of channels on every process: construction
    waits until both are attached).

    Args:
        job: the job's name (`world().job`), so concurrent jobs do not share segments.
        source, target: global ranks of the sending and the receiving process.
        me: this process's global rank (source or target).
        timeout: seconds without progress before CommTimeout.
        channel_bytes: ring-buffer bytes; a send blocks while the receiver has not read this much.
    """

    def __init__(self, job: str, source: int, target: int, me: int, timeout: float, channel_bytes: int = 4 << 20):
        from mindspore_hyper.comm.shm import one_way_channel

        self._group = one_way_channel(job, "mm", source, target, me, timeout, channel_bytes=channel_bytes)
        self.source, self.target = int(source), int(target)
        self._sending = me == source

    def send(self, message: Message) -> None:
        if not self._sending:
            raise RuntimeError(f"channel {self.source} -> {self.target}: this end receives")
        header = np.zeros(_HEADER, np.int64)
        header[:4] = (message.kind, message.batch_id, message.ids.size, message.values.size)
        header[4] = -1 if message.array is None else message.array.ndim
        if message.array is not None:
            header[6:6 + message.array.ndim] = message.array.shape
        peer = 1
        self._group.send(header, peer)
        if message.ids.size:
            self._group.send(message.ids, peer)
        if message.values.size:
            self._group.send(message.values, peer)
        if message.array is not None and message.array.size:
            self._group.send(message.array, peer)

    def recv(self) -> Message:
        if self._sending:
            raise RuntimeError(f"channel {self.source} -> {self.target}: this end sends")
        peer = 0
        header = self._group.recv((_HEADER,), np.int64, peer)
        kind, batch_id, n_ids, n_values, ndim = (int(v) for v in header[:5])
        ids = self._group.recv((n_ids,), np.int64, peer) if n_ids else np.zeros(0, np.int64)
        values = self._group.recv((n_values,), np.float64, peer) if n_values else np.zeros(0, np.float64)
        array = None
        if ndim >= 0:
            shape = tuple(int(v) for v in header[6:6 + ndim])
            array = self._group.recv(shape, np.float32, peer) if int(np.prod(shape)) else np.zeros(shape, np.float32)
        return Message(kind, batch_id, ids, values, array)

    def close(self) -> None:
        self._group.close()
