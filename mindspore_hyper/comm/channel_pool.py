"""The point-to-point channels of one job rank: one `P2PChannel` per (user, source, target),
made on first use and handed to whoever asks for it.

The pipeline's stage boundaries (user "pp"), the MPMD cross-group tensors ("x") and the
multimodal encoder/LM requests ("mm") all travel between processes on `P2PChannel`s; each user
keeps only its message encoding and asks the pool of its job rank (`channel_pool(job, rank)`)
for the channel of a directed pair. The pool makes a channel once (both ends make it: the
receiving end waits there until the sending end's thread attached, docs/comm.md), returns the
same one to later asks, and makes a fresh one after it was closed. Asks for different pairs may
come from several threads at once: a receiving end waiting for its peer blocks only the asks for
that pair.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

from mindspore_hyper.comm.p2p import P2PChannel

__all__ = ["ChannelPool", "channel_pool"]

_Key = Tuple[str, int, int]  # (user name, source, target)


class ChannelPool:
    """The channels of global rank `rank` of job `job` (see the module docstring).

    Args:
        job: the job's name (`world().job`), so concurrent jobs never share a segment.
        rank: this process's global rank: one end of every channel of the pool.
    """

    def __init__(self, job: str, rank: int):
        self.job, self.rank = job, int(rank)
        self._lock = threading.Lock()
        self._channels: Dict[_Key, Tuple[P2PChannel, tuple]] = {}
        self._making: Dict[_Key, threading.Lock] = {}

    def __repr__(self) -> str:
        return f"ChannelPool({self.job!r}, rank {self.rank}, {len(self.channels())} open channels)"

    def channel(self, name: str, source: int, target: int, timeout: float,
                channel_bytes: Optional[int] = None) -> P2PChannel:
        """The open channel `source` -> `target` of user `name`, made on first use.

        Args:
            name: the user's short name ("pp", "x", "mm", ...): users of one pair never share a channel.
            source: global rank of the sending process.
            target: global rank of the receiving process.
            timeout: the channel's timeout in seconds (`P2PChannel`).
            channel_bytes: ring-buffer bytes of the channel (None: the transport's default).

        Raises:
            ValueError: this rank is not `source` or `target`, or the open channel was made with
                another timeout or channel_bytes.
        """
        key = (name, int(source), int(target))
        options = (float(timeout), channel_bytes)
        with self._lock:
            making = self._making.setdefault(key, threading.Lock())
        with making:  # one maker per pair; other pairs go on
            with self._lock:
                found = self._channels.get(key)
            if found is not None and not found[0].closed:
                if found[1] != options:
                    raise ValueError(f"{found[0]!r} is open with timeout={found[1][0]:g}, channel_bytes={found[1][1]}; "
                                     f"asked for timeout={options[0]:g}, channel_bytes={options[1]}")
                return found[0]
            made = P2PChannel(self.job, name, source, target, self.rank, timeout, channel_bytes=channel_bytes)
            with self._lock:
                self._channels[key] = (made, options)
            return made

    def get(self, name: str, source: int, target: int) -> Optional[P2PChannel]:
        """The open channel `source` -> `target` of user `name`, or None (nothing is made)."""
        with self._lock:
            found = self._channels.get((name, int(source), int(target)))
        return found[0] if found is not None and not found[0].closed else None

    def channels(self, name: Optional[str] = None) -> List[P2PChannel]:
        """The open channels of user `name` (every user's when None), in the order made."""
        with self._lock:
            found = [c for (user, _, _), (c, _) in self._channels.items() if name in (None, user)]
        return [c for c in found if not c.closed]

    def close(self, name: Optional[str] = None) -> None:
        """Close the channels of user `name` (every user's when None): each writes what is queued
        first (`P2PChannel.close`); a later ask makes a fresh channel."""
        with self._lock:
            keys = [k for k in self._channels if name in (None, k[0])]
            closing = [self._channels.pop(k)[0] for k in keys]
        for channel in closing:
            channel.close()


_POOLS: Dict[Tuple[str, int], ChannelPool] = {}
_POOLS_LOCK = threading.Lock()


def channel_pool(job: str, rank: int) -> ChannelPool:
    """The pool of global rank `rank` of job `job` in this process (made on first use; a process
    usually holds one rank, a test may hold both ends of a channel)."""
    with _POOLS_LOCK:
        key = (job, int(rank))
        if key not in _POOLS:
            _POOLS[key] = ChannelPool(job, rank)
        return _POOLS[key]
