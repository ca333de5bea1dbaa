"""Async handles of aggregated requests."""
from __future__ import annotations

from typing import List, Optional

import numpy as np


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


EMPTY_AGGREGATOR_STATS = {"requests": 0, "packets": 0, "bypassed": 0, "batches": 0, "bytes": 0}


def submit_single(aggregator, x, op: str) -> AsyncHandle:
    """Queue one rank's all-reduce request of `x` in a C++ aggregator and return its handle."""
    from mindspore_hyper.comm._common import _C, check_op, dtype_name

    if op not in ("sum", "max", "min", "avg"):
        check_op(op)
    handle = _C.submit_copy(aggregator, x, op) if isinstance(x, np.ndarray) else None
    if handle is not None:  # C-contiguous array of a supported dtype: copied and queued in C++
        return handle
    arr = np.array(x, copy=True, order="C")
    req = aggregator.submit(arr, dtype_name(arr), op)
    return AsyncHandle([req], [arr], single=True)


class AggregatorOwner:
    """flush / aggregator_stats of a group whose C++ aggregator (`self._agg`) is made lazily."""

    _agg = None

    def flush(self) -> None:
        """Send every queued request now."""
        if self._agg is not None:
            self._agg.flush()

    def aggregator_stats(self) -> dict:
        """The aggregator's counters (all zero before the first request)."""
        return self._agg.stats() if self._agg is not None else dict(EMPTY_AGGREGATOR_STATS)
