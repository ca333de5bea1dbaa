"""Stage-boundary point-to-point transfers: one mailbox per process, fed in process (simulation)
or by `comm.p2p` channels (msrun).

A send is buffered (the schedules' contract, docs/mpmd.md): it hands the tensor over and
returns. A receive blocks until the tensor named by its `P2PTensor` arrives, so tensors may
arrive in any order. Between processes, each directed pair of ranks has its channel of user
"pp" in the rank's `comm.channel_pool` (the tensor's identity is the message's tag); the channel
writes in its own thread and reads only inside a receive, so no thread polls while the stage
computes. A receive that waits longer
than `timeout` raises `P2PTimeout` naming the peer rank. A rank that refuses a step sends, in
place of each tensor it still owes, a message standing for its refusal (`abort`); a receive that
gets one raises the same exception class with that rank's message (step_refusal.py).

A tensor may carry a header: a few ints describing it (`attach_header`; a stage's DTensor
layout, hyper_parallel/pipeline_activations.py). It travels with the tensor (as the message's
meta ints between processes, on the Tensor object in process) and is read back with `header_of`.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict, Iterable, Optional, Sequence, Set, Tuple

import numpy as np
from mindspore import Tensor

from mindspore_hyper.comm import CommError, CommTimeout
from mindspore_hyper.comm.channel_pool import channel_pool
from mindspore_hyper.pipeline.step_refusal import abort_meta, read_abort
from mindspore_hyper.schedule.actions import ActionKind, P2PTensor, Payload

__all__ = ["P2PTimeout", "P2PError", "Mailbox", "LocalTransport", "ShmTransport", "peer_pairs", "attach_header",
           "header_of", "HEADER_FLAG"]

HEADER_FLAG = 2  # first meta int of a tensor message with a header (step_refusal.ABORT_FLAG, 1, marks a refusal)
_HEADER = "_hyper_wire_header"  # attribute of a Tensor: the header ints it travels with


def attach_header(tensor: Tensor, header: Sequence[int]) -> Tensor:
    """`tensor`, marked to travel with `header` (ints; at most 63 between processes)."""
    setattr(tensor, _HEADER, tuple(int(v) for v in header))
    return tensor


def header_of(tensor) -> Optional[Tuple[int, ...]]:
    """The header `tensor` travels with, or None."""
    return getattr(tensor, _HEADER, None)


class P2PTimeout(TimeoutError):
    """A receive waited longer than the timeout for a tensor from a peer rank."""


class P2PError(RuntimeError):
    """A transfer to or from a peer rank failed."""


class Mailbox:
    """Received tensors by identity, with blocking take."""

    def __init__(self, rank: int):
        self.rank = rank
        self._items: Dict[P2PTensor, np.ndarray] = {}
        self._cond = threading.Condition()

    def put(self, key: P2PTensor, value) -> None:
        with self._cond:
            self._items[key] = value
            self._cond.notify_all()

    def poll(self, key: P2PTensor):
        """The tensor if it has arrived (removed from the mailbox), else None."""
        with self._cond:
            return self._items.pop(key, None)

    def take(self, key: P2PTensor, peer: int, timeout: float):
        """Block until `key` from `peer` arrives.

        Raises:
            P2PTimeout: nothing within `timeout` seconds (names the peer rank and the tensor).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while key not in self._items:
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


def _tag(key: P2PTensor) -> Tuple[int, int, int, int]:
    """The channel tag of a tensor's identity."""
    return (0 if key.payload is Payload.ACTIVATION else 1, key.src_stage, key.dst_stage, key.microbatch)


class ShmTransport:
    """This process's sends and receives to its peer ranks over shared memory (see module docstring).

    Args:
        world: the process's World (rank, job name, timeout).
        pairs: every directed (source, destination) pair of global ranks that sends; both
            members of a pair make its channel (in any order), taken from the rank's channel pool.
        peer_of: the global rank of this process's peer at a schedule (pipeline) rank.
    """

    def __init__(self, world, pairs: Iterable[Tuple[int, int]], peer_of: Callable[[int], int] = lambda r: r):
        if world.transport != "shm":
            raise ValueError(f"dist_transport={world.transport!r}: pipeline stages send point-to-point over the "
                             f"shared-memory transport; MindSpore's CPU backend has no send/recv. Use "
                             f"set_context(dist_transport='shm')")
        self.rank, self.timeout, self.peer_of = world.rank, world.timeout, peer_of
        self._pool = channel_pool(world.job, world.rank)
        self._to: Set[int] = set()
        self._from: Set[int] = set()
        for src, dst in pairs:
            if self.rank in (src, dst):
                self._pool.channel("pp", src, dst, self.timeout)  # made now: both ends meet here
                (self._to if self.rank == src else self._from).add(dst if self.rank == src else src)

    def _channel(self, src: int, dst: int):
        """The open channel src -> dst made by the constructor."""
        channel = self._pool.get("pp", src, dst)
        if channel is None:
            raise P2PError(f"rank {self.rank}: no open channel {src} -> {dst} (channels to {sorted(self._to)}, "
                           f"from {sorted(self._from)})")
        return channel

    def expect(self, counts: Dict[int, int]) -> None:
        """Announce this step's receives (source rank -> number of tensors): each source must
        have a channel to this rank (a receive only reads while it waits, so counts need no more)."""
        for peer in counts:
            if self.peer_of(peer) not in self._from:
                raise P2PError(f"rank {self.rank}: the schedule receives from rank {self.peer_of(peer)}, which has no "
                               f"channel to this rank (channels from {sorted(self._from)})")

    def send(self, src: int, key: P2PTensor, value: Tensor, peer: int) -> None:
        peer = self.peer_of(peer)
        try:
            header = header_of(value)
            meta = () if header is None else (HEADER_FLAG,) + header
            # not copied, as before this channel: stage outputs are not changed in place
            self._channel(self.rank, peer).send(_tag(key), [value.asnumpy()], meta=meta, copy=False)
        except TypeError as exc:
            raise P2PError(f"pipeline send of '{key}': {exc}") from None
        except CommError as exc:
            raise P2PError(f"rank {self.rank}: sending to rank {peer} failed: {exc}") from exc

    def recv(self, key: P2PTensor, peer: int):
        """The tensor `key` from pipeline rank `peer`, waiting for it.

        Raises:
            P2PTimeout / P2PError: nothing within the timeout, or the transfer failed.
            ValueError, TypeError, RuntimeError, TimeoutError: the peer refused the step (`abort`):
                the class it raised, with its rank and message.
        """
        peer = self.peer_of(peer)
        try:
            message = self._channel(peer, self.rank).recv(_tag(key), self.timeout)
        except CommTimeout as exc:
            raise P2PTimeout(f"rank {self.rank}: no '{key}' from rank {peer} (waited at most {self.timeout:g} s; "
                             f"peer rank {peer} is stalled, failed or runs another schedule): {exc}") from exc
        except CommError as exc:
            raise P2PError(f"rank {self.rank}: receiving '{key}' from rank {peer} failed: {exc}") from exc
        refused = read_abort(message.meta, message.arrays)
        if refused is not None:
            raise refused
        if message.meta and int(message.meta[0]) == HEADER_FLAG:
            return attach_header(Tensor(message.arrays[0]), message.meta[1:])
        return message.arrays[0]

    def abort(self, owed: Iterable[Tuple[P2PTensor, int]], exc: BaseException) -> None:
        """Send, in place of each tensor still owed ((key, pipeline peer rank)), a message standing
        for `exc`, and wait until they are written (at most the timeout), so that a peer waiting
        for any of them raises it too (step_refusal.py). Best effort: a failed channel is skipped,
        its peer then waits for its timeout."""
        meta, text = abort_meta(exc, self.rank)
        peers = set()
        for key, peer in owed:
            peer = self.peer_of(peer)
            try:
                self._channel(self.rank, peer).send(_tag(key), [text], meta=meta)
                peers.add(peer)
            except (CommError, CommTimeout, P2PError):
                continue
        for peer in sorted(peers):
            try:
                self._channel(self.rank, peer).flush()
            except (CommError, CommTimeout):
                continue

    def flush(self) -> None:
        """Wait until every queued send was handed to the transport; raise a failed one."""
        for peer in sorted(self._to):
            try:
                self._channel(self.rank, peer).flush()
            except CommTimeout as exc:
                raise P2PTimeout(f"rank {self.rank}: sends to rank {peer} not delivered: {exc}") from exc
            except CommError as exc:
                raise P2PError(f"rank {self.rank}: sending to rank {peer} failed: {exc}") from exc

    def close(self) -> None:
        """Close this transport's channels (each writes what is queued first)."""
        for src, dst in [(self.rank, p) for p in sorted(self._to)] + [(p, self.rank) for p in sorted(self._from)]:
            channel = self._pool.get("pp", src, dst)
            if channel is not None:
                channel.close()
