"""Async handles of aggregated requests."""
from __future__ import annotations

from typing import List, Optional


class AsyncHandle:
    """Result of an aggregated collective: `wait()` returns the reduced array(s).

    The handle keeps the buffers alive until the C++ executor has written the results.
    """

    __slots__ = ("_requests", "_arrays", "_single", "_shapes")

    def __init__(self, requests: list, arrays: list, single: bool, shapes: Optional[List[tuple]] = None):
        self._requests = requests
        self._arrays = arrays
        self._single = single
        self._shapes = shapes

    def done(self) -> bool:
        return all(r.done() for r in self._requests)

    def wait(self, timeout: Optional[float] = None):
        for r in self._requests:
            r.wait(-1.0 if timeout is None else float(timeout))
        out = [a.reshape(s) for a, s in zip(self._arrays, self._shapes)] if self._shapes else self._arrays
        return out[0] if self._single else out
