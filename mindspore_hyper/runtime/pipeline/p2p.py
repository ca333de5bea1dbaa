"""Stage-boundary point-to-point transfers: one mailbox per process, fed in process (simulation)
or by the shared-memory transport (msrun).

A send is buffered (the schedules' contract, docs/mpmd.md): it hands the tensor over and
returns. A receive blocks until the tensor named by its `P2PTensor` arrives, so tensors may
arrive in any order. Between processes, each directed pair of ranks gets its own two-member
shared-memory group; a sender thread per destination writes (header, data) messages, and a
receiver thread per source reads messages (in the order they were sent, keeping those not
needed yet in the mailbox) only while a receive waits for one of its source's tensors, within
the number the schedule announces for the step: the shared-memory transport waits by polling,
and a thread polling while the stage computes would take CPU time from it. A receive that
waits longer than `timeout` raises `P2PTimeout` naming the peer rank.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Dict, Iterable, Optional, Tuple

import numpy as np
from mindspore import Tensor

from mindspore_hyper.schedule.actions import ActionKind, P2PTensor, Payload

__all__ = ["P2PTimeout", "P2PError", "Mailbox", "LocalTransport", "ShmTransport", "peer_pairs"]

_DTYPES = ("float32", "float16", "float64", "int32", "int64", "bool", "uint8", "int8")
_HEADER = 16  # int64 words: payload, src, dst, microbatch, dtype, ndim, dims (at most 10)
_MAX_DIMS = _HEADER - 6


class P2PTimeout(TimeoutError):
    """A receive waited longer than the timeout for a tensor from a peer rank."""


class P2PError(RuntimeError):
    """A transfer to or from a peer rank failed."""


class Mailbox:
    """Received tensors by identity, with blocking take."""

    def __init__(self, rank: int):
        self.rank = rank
        self._items: Dict[P2PTensor, np.ndarray] = {}
        self._failed: Dict[int, BaseException] = {}
        self._cond = threading.Condition()

    def put(self, key: P2PTensor, value) -> None:
        with self._cond:
            self._items[key] = value
            self._cond.notify_all()

    def fail(self, peer: int, exc: BaseException) -> None:
        with self._cond:
            self._failed[peer] = exc
            self._cond.notify_all()

    def has(self, key: P2PTensor) -> bool:
        with self._cond:
            return key in self._items

    def poll(self, key: P2PTensor):
        """The tensor if it has arrived (removed from the mailbox), else None."""
        with self._cond:
            return self._items.pop(key, None)

    def take(self, key: P2PTensor, peer: int, timeout: float):
        """Block until `key` from `peer` arrives.

        Raises:
            P2PTimeout: nothing within `timeout` seconds (names the peer rank and the tensor).
            P2PError: the transfer from `peer` failed.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while key not in self._items:
                if peer in self._failed:
                    raise P2PError(f"rank {self.rank}: receiving '{key}' from rank {peer} failed: "
                                   f"{self._failed[peer]}") from self._failed[peer]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise P2PTimeout(f"rank {self.rank}: no '{key}' from rank {peer} within {timeout:g} s "
                                     f"(peer rank {peer} is stalled, failed or runs another schedule)")
                self._cond.wait(min(left, 0.5))
            return self._items.pop(key)


class LocalTransport:
    """All ranks in this process (simulation): a send puts the tensor in the peer's mailbox."""

    def __init__(self, num_ranks: int):
        self.mailboxes = [Mailbox(r) for r in range(num_ranks)]

    def send(self, src: int, key: P2PTensor, value: Tensor, peer: int) -> None:
        self.mailboxes[peer].put(key, value)

    def poll(self, rank: int, key: P2PTensor):
        return self.mailboxes[rank].poll(key)


def peer_pairs(schedule) -> Tuple[Tuple[int, int], ...]:
    """The directed (source, destination) rank pairs the schedule sends along, sorted."""
    pairs = {(rank, a.peer) for rank, actions in enumerate(schedule.actions) for a in actions
             if a.kind is ActionKind.SEND}
    return tuple(sorted(pairs))


def _encode(key: P2PTensor, arr: np.ndarray) -> np.ndarray:
    if arr.dtype.name not in _DTYPES:
        raise P2PError(f"pipeline send of '{key}': dtype {arr.dtype} is not supported; expected one of {_DTYPES}")
    if arr.ndim > _MAX_DIMS:
        raise P2PError(f"pipeline send of '{key}': {arr.ndim} dimensions, at most {_MAX_DIMS}")
    header = np.zeros(_HEADER, dtype=np.int64)
    header[:6] = (0 if key.payload is Payload.ACTIVATION else 1, key.src_stage, key.dst_stage, key.microbatch,
                  _DTYPES.index(arr.dtype.name), arr.ndim)
    header[6:6 + arr.ndim] = arr.shape
    return header


def _decode(header: np.ndarray) -> Tuple[P2PTensor, Tuple[int, ...], str]:
    payload = Payload.ACTIVATION if header[0] == 0 else Payload.GRADIENT
    key = P2PTensor(payload, int(header[1]), int(header[2]), int(header[3]))
    ndim = int(header[5])
    return key, tuple(int(d) for d in header[6:6 + ndim]), _DTYPES[int(header[4])]


class _Sender(threading.Thread):
    """Writes queued messages to one destination, in order."""

    def __init__(self, group, peer: int, mailbox: Mailbox):
        super().__init__(name=f"pipeline-send-{peer}", daemon=True)
        self.group, self.peer, self.mailbox = group, peer, mailbox
        self.queue: "queue.Queue" = queue.Queue()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            header, arr = item
            try:
                if self.error is None:
                    self.group.send(header, 1)
                    self.group.send(arr, 1)
            except BaseException as exc:  # noqa: BLE001 -- reported to the main thread
                self.error = exc
            finally:
                self.queue.task_done()


class _Receiver(threading.Thread):
    """Reads messages from one source into the mailbox while a wanted tensor is missing, at
    most the announced number."""

    def __init__(self, group, peer: int, mailbox: Mailbox):
        super().__init__(name=f"pipeline-recv-{peer}", daemon=True)
        self.group, self.peer, self.mailbox = group, peer, mailbox
        self._pending = 0
        self._wanted = set()
        self._closed = False
        self._cond = threading.Condition()

    def expect(self, count: int) -> None:
        with self._cond:
            self._pending += count
            self._cond.notify_all()

    def need(self, key: P2PTensor) -> None:
        """A receive waits for `key`: read messages until it is in the mailbox."""
        with self._cond:
            self._wanted.add(key)
            self._cond.notify_all()

    def _missing(self) -> bool:
        self._wanted = {k for k in self._wanted if not self.mailbox.has(k)}
        return bool(self._wanted)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (self._pending > 0 and self._missing()):
                    self._cond.wait()
                if self._closed:
                    return
            try:
                header = self.group.recv((_HEADER,), np.int64, 0)
                key, shape, dtype = _decode(header)
                self.mailbox.put(key, self.group.recv(shape, np.dtype(dtype), 0))
            except BaseException as exc:  # noqa: BLE001 -- reported to the main thread
                self.mailbox.fail(self.peer, exc)
                return
            with self._cond:
                self._pending -= 1


class ShmTransport:
    """This process's sends and receives to its peer ranks over shared memory (see module docstring).

    Args:
        world: the process's World (rank, job name, timeout).
        pairs: every directed (source, destination) pair of global ranks that sends; the
            groups are made collectively in this order by the two members of each.
        peer_of: the global rank of this process's peer at a schedule (pipeline) rank.
    """

    def __init__(self, world, pairs: Iterable[Tuple[int, int]], peer_of: Callable[[int], int] = lambda r: r):
        from mindspore_hyper.comm.shm import one_way_channel

        if world.transport != "shm":
            raise ValueError(f"dist_transport={world.transport!r}: pipeline stages send point-to-point over the "
                             f"shared-memory transport; MindSpore's CPU backend has no send/recv. Use "
                             f"set_context(dist_transport='shm')")
        self.rank, self.timeout, self.peer_of = world.rank, world.timeout, peer_of
        self.mailbox = Mailbox(self.rank)
        self._senders: Dict[int, _Sender] = {}
        self._receivers: Dict[int, _Receiver] = {}
        for src, dst in pairs:
            if self.rank not in (src, dst):
                continue
            group = one_way_channel(world.job, "pp", src, dst, self.rank, world.timeout)
            if self.rank == src:
                self._senders[dst] = _Sender(group, dst, self.mailbox)
                self._senders[dst].start()
            else:
                self._receivers[src] = _Receiver(group, src, self.mailbox)
                self._receivers[src].start()

    def expect(self, counts: Dict[int, int]) -> None:
        """Announce this step's receives: source rank -> number of tensors."""
        for peer, count in counts.items():
            self._receivers[self.peer_of(peer)].expect(count)

    def send(self, src: int, key: P2PTensor, value: Tensor, peer: int) -> None:
        peer = self.peer_of(peer)
        sender = self._senders[peer]
        if sender.error is not None:
            raise P2PError(f"rank {self.rank}: sending to rank {peer} failed: {sender.error}") from sender.error
        arr = np.ascontiguousarray(value.asnumpy())
        sender.queue.put((_encode(key, arr), arr))

    def recv(self, key: P2PTensor, peer: int):
        peer = self.peer_of(peer)
        if not self.mailbox.has(key):
            self._receivers[peer].need(key)
        return self.mailbox.take(key, peer, self.timeout)

    def flush(self) -> None:
        """Wait until every queued send was handed to the transport; raise a failed one."""
        for peer, sender in self._senders.items():
            deadline = time.monotonic() + self.timeout
            while sender.queue.unfinished_tasks and time.monotonic() < deadline:
                time.sleep(1e-4)
            if sender.error is not None:
                raise P2PError(f"rank {self.rank}: sending to rank {peer} failed: {sender.error}") from sender.error
            if sender.queue.unfinished_tasks:
                raise P2PTimeout(f"rank {self.rank}: sends to rank {peer} not delivered within {self.timeout:g} s")

    def close(self) -> None:
        for sender in self._senders.values():
            sender.queue.put(None)
        for receiver in self._receivers.values():
            receiver.close()
