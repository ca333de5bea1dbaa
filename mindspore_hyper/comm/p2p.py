"""One direction of point-to-point exchange between two processes: tagged messages of arrays over
a two-member shared-memory communicator (`one_way_channel`).

The pipeline's stage boundaries, the MPMD cross-group tensors and the multimodal encoder/LM
requests all travel as `Message`s on a `P2PChannel`: a tag (a few ints, the name the receiver
asks for), optional metadata (a few ints) and arrays of any supported dtype and shape. The wire
format and its limits, checked on both ends (a malformed message is a `FrameError` naming the
peer and the field, and aborts the channel), are `p2p_framing.py`'s.

The sending end hands messages to its own background thread (`send` returns at once, having
copied the arrays unless told not to; `flush` waits until they are written), so a process never
blocks on a full channel while its peer computes; the queue holds at most `max_queued_bytes` of
array data: a `send` beyond waits for the thread to write (back-pressure), at most the channel's
timeout. That thread also opens the communicator, so constructing the sending end never waits
for the peer. The receiving end opens the communicator in its constructor (it waits until the
sender attached) and reads only inside `recv`, in the calling thread: messages read while
looking for another tag are kept, in arrival order, for later receives, up to
`max_unmatched_bytes`; a receive that finds the kept messages over that limit raises CommError
(the messages stay kept) instead of reading on. A receive that waits too long, or whose peer
died, raises the transport's `CommTimeout` naming this rank, the peer rank and the tag; the
receiving end is unusable from then on (the transport aborts the group, as for any collective).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Deque, List, Optional, Sequence, Tuple

import numpy as np

from mindspore_hyper.comm._common import CommError, CommTimeout
from mindspore_hyper.comm.p2p_framing import (MAX_META, MAX_TAG, P2P_DTYPES, FrameError, Message, Tag, as_ints,
                                              check_array, check_message, read_message, write_message)
from mindspore_hyper.comm.shm import DEFAULT_MAX_MESSAGE_BYTES, ShmCommunicator, one_way_channel

__all__ = ["P2PChannel", "Message", "Tag", "P2P_DTYPES", "FrameError"]

DEFAULT_MAX_QUEUED_BYTES = 256 << 20
DEFAULT_MAX_UNMATCHED_BYTES = 256 << 20


def _check_arguments(source: int, target: int, me: int, timeout: float, **limits: int) -> None:
    """Raise ValueError naming the argument: `me` not one of two distinct ends, a timeout or a
    byte limit not positive."""
    if me not in (source, target) or source == target:
        raise ValueError(f"channel {source} -> {target}: me={me} is not one of its two ends")
    if not timeout > 0:
        raise ValueError(f"timeout={timeout!r}: expected a positive number of seconds")
    for arg, value in limits.items():
        if not (isinstance(value, (int, np.integer)) and value > 0):
            raise ValueError(f"{arg}={value!r}: expected a positive number of bytes")


class _KeptMessages:
    """The receiving end's messages read and not yet received, in arrival order, with their
    array bytes (bounded by the channel's `max_unmatched_bytes`). Guarded by the channel's lock."""

    def __init__(self):
        self._messages: List[Tuple[Message, int]] = []
        self.nbytes = 0

    def add(self, message: Message) -> None:
        nbytes = sum(arr.nbytes for arr in message.arrays)
        self._messages.append((message, nbytes))
        self.nbytes += nbytes

    def take(self, want: Optional[Tuple[int, ...]]) -> Optional[Message]:
        """The first kept message with tag `want` (any if None), removed; None if there is none."""
        for i, (message, nbytes) in enumerate(self._messages):
            if want is None or message.tag == want:
                del self._messages[i]
                self.nbytes -= nbytes
                return message
        return None

    def describe(self) -> str:
        tags = sorted({m.tag for m, _ in self._messages})
        return f"{len(self._messages)} messages of other tags {tags} ({self.nbytes} bytes)"


class P2PChannel:
    """This process's end of the one-way channel `source` -> `target` (global ranks).

    Both ends construct it with the same arguments (in any order: the sending end's thread and
    the receiving end's constructor meet). See the module docstring for the protocol.

    Args:
        job: the job's name (`world().job`), so concurrent jobs never share a segment.
        name: the user's short name ("pp", "x", "mm", ...), so several users of one pair do not share one.
        source: global rank of the sending process.
        target: global rank of the receiving process.
        me: this process's global rank (`source` or `target`).
        timeout: seconds: bounds the rendezvous, a receive (default), a flush (default) and any
            transfer without progress.
        channel_bytes: ring-buffer bytes of the communicator (None: the transport's default); the
            sender thread waits while the receiver has not read this much.
        max_message_bytes: the most array bytes of one message (both ends: the sender refuses
            more, the receiver rejects a peer announcing more before allocating it).
        max_queued_bytes: array bytes the sending end queues before `send` waits for its thread.
        max_unmatched_bytes: array bytes of messages of other tags the receiving end keeps
            before a receive raises instead of reading on.

    Raises:
        ValueError: `me` is not one of the two ends, or `timeout` or a limit is not positive.
    """

    def __init__(self, job: str, name: str, source: int, target: int, me: int, timeout: float,
                 channel_bytes: Optional[int] = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES, max_unmatched_bytes: int = DEFAULT_MAX_UNMATCHED_BYTES):
        _check_arguments(source, target, me, timeout, max_message_bytes=max_message_bytes,
                         max_queued_bytes=max_queued_bytes, max_unmatched_bytes=max_unmatched_bytes)
        self.job, self.name = job, name
        self.source, self.target, self.me = int(source), int(target), int(me)
        self.timeout = float(timeout)
        self.max_message_bytes = int(max_message_bytes)
        self.max_queued_bytes = int(max_queued_bytes)
        self.max_unmatched_bytes = int(max_unmatched_bytes)
        self._channel_bytes = channel_bytes
        self._cond = threading.Condition()
        self._closed = False
        self._comm = None
        # sending end
        self._outgoing: Deque[Tuple[Message, int]] = deque()
        self._unsent = 0
        self._queued_bytes = 0
        self._send_error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        # receiving end
        self._kept = _KeptMessages()
        self._reading = False
        self._recv_error: Optional[BaseException] = None
        if self.sending:
            self._thread = threading.Thread(target=self._send_loop, name=f"p2p-{name}-{source}to{target}", daemon=True)
            self._thread.start()
        else:
            self._comm = self._open()

    @property
    def sending(self) -> bool:
        """True at the source end, False at the target end."""
        return self.me == self.source

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._closed

    def __repr__(self) -> str:
        return f"P2PChannel({self.name!r}, {self.source} -> {self.target}, rank {self.me})"

    def _open(self) -> ShmCommunicator:
        kwargs = {"max_message_bytes": self.max_message_bytes}
        if self._channel_bytes is not None:
            kwargs["channel_bytes"] = int(self._channel_bytes)
        return one_way_channel(self.job, self.name, self.source, self.target, self.me, self.timeout, **kwargs)

    def _check_end(self, sending: bool, what: str) -> None:
        if self.sending != sending:
            role = "sends" if self.sending else "receives"
            raise RuntimeError(f"{self!r}: {what} is not possible at this end (it {role})")
        if self._closed:
            raise CommError(f"{self!r} is closed: no {what} after close()")

    # ----- sending end ---------------------------------------------------------------------------
    def send(self, tag: Tag, arrays: Sequence[np.ndarray] = (), meta: Sequence[int] = (), copy: bool = True) -> None:
        """Queue a message for the peer and return.

        Args:
            tag: an int or a tuple of at most 8 ints, the name the receiver asks for.
            arrays: arrays of the dtypes in `P2P_DTYPES`, any shape (0-d and empty included).
            meta: at most 64 ints delivered with the message.
            copy: copy the arrays now, so the caller may change them at once; False when they
                are not changed until written (fresh arrays, or a `flush` before reuse).

        Raises:
            ValueError: `tag` or `meta` is not int64 values, or the message breaks the framing's
                limits (more than 1024 arrays, 32 dimensions or `max_message_bytes`; names the argument).
            TypeError: an array's dtype is not supported (names `arrays[i]`).
            CommTimeout: the queue stayed above `max_queued_bytes` for the channel's timeout
                (the peer does not read; names it).
            CommError / CommTimeout: an earlier send failed (names the peer).
        """
        self._check_end(True, "send")
        message = Message(as_ints(tag, "tag", MAX_TAG, allow_empty=False),
                          tuple(check_array(a, i, copy) for i, a in enumerate(arrays)),
                          as_ints(meta, "meta", MAX_META, allow_empty=True))
        nbytes = check_message(message, self.max_message_bytes)
        deadline = time.monotonic() + self.timeout
        with self._cond:
            self._raise_send_error()
            while self._queued_bytes and self._queued_bytes + nbytes > self.max_queued_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommTimeout(f"{self!r}: {self._queued_bytes} bytes queued for rank {self.target} stayed "
                                      f"above max_queued_bytes={self.max_queued_bytes} for {self.timeout:g} s "
                                      f"(rank {self.target} does not read)")
                self._cond.wait(left)
                self._raise_send_error()
                if self._closed:
                    raise CommError(f"{self!r} was closed while a send waited for queue space")
            self._outgoing.append((message, nbytes))
            self._unsent += 1
            self._queued_bytes += nbytes
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Messages queued by `send` and not yet written to the transport."""
        with self._cond:
            return self._unsent

    def flush(self, timeout: Optional[float] = None) -> None:
        """Wait until every queued message was written to the transport (the peer may not have
        read it yet).

        Args:
            timeout: seconds (default: the channel's timeout).

        Raises:
            CommTimeout: messages are still queued after `timeout` (names the peer).
            CommError / CommTimeout: a send failed (names the peer).
        """
        self._check_end(True, "flush")
        timeout = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._unsent and self._send_error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommTimeout(f"{self!r}: {self._unsent} messages to rank {self.target} not written within "
                                      f"{timeout:g} s (rank {self.target} does not read)")
                self._cond.wait(left)
            self._raise_send_error()

    def check(self) -> None:
        """Raise a failed send now (without waiting for the queue).

        Raises:
            CommError / CommTimeout: a send failed (names the peer).
        """
        self._check_end(True, "check")
        with self._cond:
            self._raise_send_error()

    def _raise_send_error(self) -> None:
        if self._send_error is not None:
            exc = self._send_error
            raise type(exc)(f"rank {self.me}: sending to rank {self.target} on {self.name!r} failed: {exc}") from exc

    def _send_loop(self) -> None:
        try:
            comm = self._open()
        except Exception as exc:  # noqa: BLE001 -- raised to the sending threads by send / flush / check
            comm, self._send_error = None, exc
        with self._cond:
            self._comm = comm
        while True:
            with self._cond:
                while not self._outgoing and not self._closed:
                    self._cond.wait()
                if not self._outgoing:
                    return
                message, nbytes = self._outgoing.popleft()
                failed = self._send_error is not None
            try:
                if not failed:
                    write_message(comm, message)
            except Exception as exc:  # noqa: BLE001 -- raised to the sending threads by send / flush / check
                with self._cond:
                    self._send_error = exc
            finally:
                with self._cond:
                    self._unsent -= 1
                    self._queued_bytes -= nbytes
                    self._cond.notify_all()

    # ----- receiving end -------------------------------------------------------------------------
    def recv(self, tag: Optional[Tag] = None, timeout: Optional[float] = None) -> Message:
        """The first arrived message with `tag` (any tag if None), waiting for it.

        Messages of the peer arrive in the order it sent them; those read while waiting for
        another tag are kept for later receives. Several threads may receive at once.

        Args:
            tag: the tag to wait for (an int or a tuple of ints), or None for the next message.
            timeout: seconds (default: the channel's timeout).

        Raises:
            CommTimeout: nothing with `tag` within `timeout`, or the peer died (names this rank,
                the peer rank and the tag); the channel is unusable afterwards.
            CommError: the messages of other tags kept exceed `max_unmatched_bytes` (they stay
                kept), or the transport failed (names the peer).
            FrameError: the peer sent a malformed message (names the peer and the field); the
                channel is unusable afterwards.
        """
        self._check_end(False, "recv")
        want = None if tag is None else as_ints(tag, "tag", MAX_TAG, allow_empty=False)
        timeout = self.timeout if timeout is None else float(timeout)
        if not timeout > 0:
            raise ValueError(f"timeout={timeout!r}: expected a positive number of seconds")
        deadline = time.monotonic() + timeout
        what = "any message" if want is None else f"tag {want}"
        while True:
            with self._cond:
                while True:
                    found = self._kept.take(want)
                    if found is not None:
                        return found
                    if self._closed:
                        raise CommError(f"{self!r} was closed while waiting for {what}")
                    if self._recv_error is not None:
                        exc = self._recv_error
                        raise type(exc)(f"rank {self.me}: waiting for {what} from rank {self.source} on "
                                        f"{self.name!r}: {exc}") from exc
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise CommTimeout(f"rank {self.me}: no {what} from rank {self.source} on {self.name!r} "
                                          f"within {timeout:g} s")
                    if not self._reading and self._kept.nbytes >= self.max_unmatched_bytes:
                        raise CommError(f"rank {self.me}: waiting for {what} from rank {self.source} on "
                                        f"{self.name!r}: {self._kept.describe()} wait unreceived, over "
                                        f"max_unmatched_bytes={self.max_unmatched_bytes}; receive them first (they "
                                        f"stay kept)")
                    if not self._reading:
                        self._reading = True
                        break
                    self._cond.wait(left)
            try:
                message = read_message(self._comm, left, self.timeout, self.max_message_bytes,
                                       f"rank {self.me}: malformed message from rank {self.source} on {self.name!r}")
            except Exception as exc:  # noqa: BLE001 -- raised to every receive of this channel, naming its tag
                with self._cond:
                    self._recv_error = exc
                    self._reading = False
                    self._cond.notify_all()
                continue  # raised above, naming the tag
            with self._cond:
                self._kept.add(message)
                self._reading = False
                self._cond.notify_all()

    # ----- both ends -----------------------------------------------------------------------------
    def close(self) -> None:
        """Write what is still queued (at most the channel's timeout), stop the sender thread and
        unmap the communicator; later calls raise CommError. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            deadline = time.monotonic() + self.timeout
            while self._reading and time.monotonic() < deadline:  # a receive in progress ends by its timeout
                self._cond.wait(deadline - time.monotonic())
        if self._thread is not None:
            self._thread.join(2 * self.timeout + 1.0)
        with self._cond:
            comm, self._comm = self._comm, None
        if comm is not None:
            comm.close()

    def __enter__(self) -> "P2PChannel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
