"""Point-to-point messages between two processes of an msrun job: a request (kind, batch id,
request ids or keys, float values such as timestamps, an optional float32 array) over a
one-directional `comm.p2p` channel.

Each directed pair of ranks has its own channel (user "mm" of the rank's `comm.channel_pool`), so
one thread sends and one thread receives on it. A request travels as one channel message: its
kind is the tag, its batch id the metadata, its parts the arrays; the receiver takes requests in
the order sent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from mindspore_hyper.comm.channel_pool import channel_pool

__all__ = ["StageMessage", "Channel", "FEATURES", "TAKEN", "DONE", "REPORT", "END"]

FEATURES, TAKEN, DONE, REPORT, END = 1, 2, 3, 4, 5
_KINDS = {FEATURES: "features", TAKEN: "taken", DONE: "done", REPORT: "report", END: "end"}
_MAX_DIMS = 8


@dataclass
class StageMessage:
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
    """One direction between this process and its peer (global ranks): the pair's channel of the
    rank's channel pool, carrying `StageMessage`s.

    Both ends construct it (the receiving end waits there until the sending end attached).

    Args:
        job: the job's name (`world().job`), so concurrent jobs do not share segments.
        source, target: global ranks of the sending and the receiving process.
        me: this process's global rank (source or target).
        timeout: seconds without progress before CommTimeout.
        channel_bytes: ring-buffer bytes; a send blocks while the receiver has not read this much.
    """

    def __init__(self, job: str, source: int, target: int, me: int, timeout: float, channel_bytes: int = 4 << 20):
        self._channel = channel_pool(job, me).channel("mm", source, target, timeout, channel_bytes=channel_bytes)
        self.source, self.target = int(source), int(target)

    def send(self, message: StageMessage) -> None:
        """Send `message` and return once it is written to the transport (the peer may not have read it)."""
        arrays = [message.ids, message.values] + ([] if message.array is None else [message.array])
        self._channel.send(message.kind, arrays, meta=(message.batch_id,), copy=False)  # written before return
        self._channel.flush()

    def recv(self) -> StageMessage:
        """The next message (blocks)."""
        got = self._channel.recv()
        array = got.arrays[2] if len(got.arrays) == 3 else None
        return StageMessage(got.tag[0], got.meta[0], got.arrays[0], got.arrays[1], array)

    def close(self) -> None:
        self._channel.close()
