"""Host staging buffers of asynchronous saves, reused from one save to the next.

An asynchronous save copies the Parameters' host arrays into the images of its rank files
(`snapshot.py`). Into a fresh buffer that copy costs its page faults (several times the copy
itself); into the buffer of the previous save it is a plain memory copy. So a finished save's
buffers are kept for the next one (one snapshot's worth of host memory, as torch's asynchronous
checkpointing keeps its staging buffers); `release_staging()` frees them.
"""
from __future__ import annotations

import threading
from typing import Dict, Hashable

import numpy as np

__all__ = ["ALIGN", "staging_bytes", "give_back", "release_staging"]

ALIGN = 4096  # buffers start on a page and span whole pages (O_DIRECT writes them as they are)

_free: Dict[Hashable, np.ndarray] = {}
_lock = threading.Lock()


def staging_bytes(key: Hashable, nbytes: int) -> np.ndarray:
    """A page-aligned uint8 buffer of `nbytes` rounded up to whole pages (not filled): the one
    kept under `key` if it has that size, else a new one."""
    size = -(-nbytes // ALIGN) * ALIGN
    with _lock:
        buffer = _free.pop(key, None)
    if buffer is None or buffer.size != size:
        raw = np.empty(size + ALIGN, np.uint8)
        start = -raw.ctypes.data % ALIGN
        buffer = raw[start:start + size]
    return buffer


def give_back(buffers: Dict[Hashable, np.ndarray]) -> None:
    """Keep a finished save's staging buffers for the next save."""
    with _lock:
        _free.update(buffers)


def release_staging() -> None:
    """Free every kept staging buffer."""
    with _lock:
        _free.clear()
