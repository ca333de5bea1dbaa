"""Aggregated all-reduces sent on the caller's thread, at the caller's flush (MindSpore transport).

Why not the C++ aggregator: it sends a packet from its own executor thread when a timer fires or
its queue fills, a moment that differs between ranks. Over MindSpore's collectives
(mint.distributed; its CPU backend in particular) that breaks a data x tensor job: the executor's
data-group packet runs while the main thread's backward runs a tensor-group all-reduce, two
collectives of one process at once, and the ranks meet their groups' collectives in different
orders, so MindSpore reports "AllReduce failed" (or the ranks wait for each other for ever).

This aggregator has no thread: requests wait in a queue until `flush()` (called by a handle's
`wait()`, by the group's next direct collective, or by the user), which sends them on the calling
thread. Every rank runs the same program, so every rank sends the same packets at the same point
of it, and collectives of different groups keep the program's order. Before the packets, one small
all-reduce compares the ranks' queues (length and a hash of sizes, dtypes and ops): a rank that
queued other requests is a CommMismatch, never a wrong sum. The overlap of the reduction with the
backward is lost on this transport; the packing (fewer, larger collectives) is kept.

Same interface and counters as the C++ aggregator: submit, submit_many, flush, stats, close.
"""
from __future__ import annotations

import zlib
from typing import Callable, List, Optional, Sequence

import numpy as np

from mindspore_hyper.comm._common import CommError, CommMismatch, dtype_name

__all__ = ["CallerThreadAggregator"]


class _Request:
    """One queued all-reduce: its own copy of the data (1-D), reduced in place once sent."""

    __slots__ = ("data", "shape", "op", "done", "error")

    def __init__(self, x, op: str):
        arr = np.array(x, copy=True, order="C")
        dtype_name(arr)  # TypeError for a dtype the comm library does not carry
        self.shape, self.data, self.op = arr.shape, arr.reshape(-1), op
        self.done, self.error = False, None

    def result(self) -> np.ndarray:
        if self.error is not None:
            raise self.error
        return self.data.reshape(self.shape)


class _Handle:
    """Result of one request: `wait()` flushes the aggregator if the request is still queued."""

    def __init__(self, owner: "CallerThreadAggregator", request: _Request):
        self._owner, self._request = owner, request

    def wait(self, timeout: Optional[float] = None) -> np.ndarray:
        """The reduced array (the request's own storage); waiting again returns the same array.

        Args:
            timeout: accepted for the C++ handles' interface; MindSpore's collectives apply their own.
        """
        if not self._request.done:
            self._owner.flush(timeout)
        return self._request.result()

    def done(self) -> bool:
        return self._request.done


class _BatchHandle:
    """Result of `submit_many`: `wait()` gives the reduced arrays in submission order."""

    def __init__(self, owner: "CallerThreadAggregator", requests: List[_Request]):
        self._owner, self._requests = owner, requests

    def wait(self, timeout: Optional[float] = None) -> list:
        if not all(r.done for r in self._requests):
            self._owner.flush(timeout)
        return [r.result() for r in self._requests]

    def done(self) -> bool:
        return all(r.done for r in self._requests)

    def __len__(self) -> int:
        return len(self._requests)


class CallerThreadAggregator:
    """Queue of all-reduce requests of one group, packed and sent by `flush()` on the calling thread.

    Args:
        all_reduce: `all_reduce(array, op)` reduces a 1-D array in place over the group (op "sum",
            "max" or "min": an "avg" request is sent as "sum" and divided here).
        group_size: members of the group (for "avg").
        packet_bytes: most bytes of one packet (per dtype and op); a larger request goes alone.
        what: the group's name in error messages.
    """

    def __init__(self, all_reduce: Callable[[np.ndarray, str], None], group_size: int, packet_bytes: int, what: str):
        if packet_bytes <= 0:
            raise ValueError(f"packet_bytes={packet_bytes}: expected a positive number of bytes")
        self._all_reduce, self._size, self.packet_bytes, self._what = all_reduce, group_size, packet_bytes, what
        self._queue: List[_Request] = []
        self._closed = False
        self._stats = {"requests": 0, "packets": 0, "in_place": 0, "bypassed": 0, "batches": 0, "bytes": 0}

    def submit(self, x, op: str) -> _Handle:
        """Copy `x` and queue its all-reduce; returns its handle."""
        return _Handle(self, self._queue_one(x, op))

    def submit_many(self, arrays: Sequence, op: str) -> _BatchHandle:
        """Copy and queue every array in order; returns one handle for all of them."""
        return _BatchHandle(self, [self._queue_one(x, op) for x in arrays])

    def _queue_one(self, x, op: str) -> _Request:
        if self._closed:
            raise CommError(f"{self._what} is closed: all_reduce_async is not available after close()")
        request = _Request(x, op)
        self._queue.append(request)
        self._stats["requests"] += 1
        return request

    def flush(self, timeout: Optional[float] = None) -> None:
        """Send every queued request now, on this thread, and return when they are reduced.

        Args:
            timeout: accepted for the C++ aggregator's interface; MindSpore's collectives apply
                their own.

        Raises:
            CommMismatch: the ranks queued different requests (the queue is dropped, its handles fail).
            CommError: the aggregator is closed, or a collective failed (its requests fail with it).
        """
        del timeout
        if self._closed:
            raise CommError(f"{self._what} is closed: flush is not available after close()")
        queue, self._queue = self._queue, []
        if not queue:
            return
        try:
            self._agree(queue)
            self._stats["batches"] += 1
            open_packets: dict = {}  # (dtype, op) -> requests of the packet being filled, in order
            for request in queue:
                key = (request.data.dtype.str, request.op)
                if request.data.nbytes > self.packet_bytes:
                    self._send([request])
                    self._stats["bypassed"] += 1
                    continue
                packet = open_packets.setdefault(key, [])
                if packet and sum(r.data.nbytes for r in packet) + request.data.nbytes > self.packet_bytes:
                    self._send(packet)
                    self._stats["packets"] += 1
                    packet = open_packets[key] = []
                packet.append(request)
            for packet in open_packets.values():
                if packet:
                    self._send(packet)
                    self._stats["packets"] += 1
        except Exception as exc:
            error = exc if isinstance(exc, (CommError, CommMismatch)) else CommError(f"{self._what}: {exc}")
            for request in queue:
                if not request.done:
                    request.error, request.done = error, True
            raise error from exc

    def _agree(self, queue: List[_Request]) -> None:
        """One all-reduce (max) of this rank's queue digest: every rank must hold the same requests."""
        signature = ";".join(f"{r.data.dtype.str},{r.op},{r.data.size}" for r in queue).encode()
        digest = zlib.crc32(signature)
        high, low = digest >> 16, digest & 0xFFFF  # exact in int32, MindSpore's CPU reduces no 64-bit type
        mine = np.array([len(queue), -len(queue), high, -high, low, -low], np.int32)
        seen = mine.copy()
        self._all_reduce(seen, "max")
        if (seen[0], -seen[1], seen[2], -seen[3], seen[4], -seen[5]) != (len(queue),) * 2 + (high,) * 2 + (low,) * 2:
            raise CommMismatch(f"{self._what}: the ranks queued different all_reduce_async requests before this "
                               f"flush (queue lengths {-seen[1]}..{seen[0]}, this rank {len(queue)}); every rank "
                               f"must queue the same requests (sizes, dtypes, ops) in the same order")

    def _send(self, requests: List[_Request]) -> None:
        op = requests[0].op
        wire_op = "sum" if op == "avg" else op
        if len(requests) == 1:
            buf = requests[0].data
            self._all_reduce(buf, wire_op)
        else:
            buf = np.concatenate([r.data for r in requests])
            self._all_reduce(buf, wire_op)
        offset = 0
        for r in requests:
            if len(requests) > 1:
                r.data[...] = buf[offset:offset + r.data.size]
            offset += r.data.size
            if op == "avg":
                if r.data.dtype.kind == "f":
                    r.data /= self._size
                else:
                    r.data[...] = np.trunc(r.data / self._size)
            r.done = True
            self._stats["bytes"] += r.data.nbytes

    def stats(self) -> dict:
        """The counters: requests, packets (packed sends), in_place (always 0: packets are packed
        copies), bypassed (requests sent alone), batches (flushes that sent something), bytes."""
        return dict(self._stats)

    def close(self) -> None:
        """Queued requests fail with CommError; later submissions and flushes raise it."""
        self._closed = True
        for request in self._queue:
            request.error, request.done = CommError(f"{self._what} was closed with this request queued"), True
        self._queue = []
