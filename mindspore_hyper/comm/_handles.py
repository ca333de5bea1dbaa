"""Async handles of aggregated requests and the aggregation methods shared by the groups.

A request owns a copy of its input (made on submission, in C++), so the caller's array may be
reused at once and a dropped handle never leaves the executor writing into freed memory. A
single-rank group's handle is the C++ `ArrayHandle`: `wait(timeout=None)` returns the result (a
view of the request's own storage; waiting again returns the same array), `done()` polls.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from mindspore_hyper.comm._common import CommError, check_op

EMPTY_AGGREGATOR_STATS = {"requests": 0, "packets": 0, "in_place": 0, "bypassed": 0, "batches": 0, "bytes": 0}


class AsyncHandle:
    """Result of an aggregated all-reduce over every rank of an in-process group: `wait()`
    returns the per-rank result arrays (index = rank)."""

    __slots__ = ("_handles",)

    def __init__(self, handles: list):
        self._handles = handles

    def done(self) -> bool:
        return all(h.done() for h in self._handles)

    def wait(self, timeout: Optional[float] = None) -> List[np.ndarray]:
        return [h.wait(timeout) for h in self._handles]


class Closed:
    """Stands in for the C++ handles of a closed group: any use raises CommError naming the group."""

    __slots__ = ("_what",)

    def __init__(self, what: str):
        self._what = what

    def __getattr__(self, name: str):
        raise CommError(f"{self._what} is closed: {name} is not available after close(); create a new group")


class AggregatorOwner:
    """all_reduce_async(_many) / flush / aggregator_stats of a group whose C++ aggregator (`self._agg`)
    is made lazily by `_new_aggregator()`; `close()` replaces it with `Closed`."""

    _agg = None

    def _new_aggregator(self):
        raise NotImplementedError

    def _aggregator(self):
        if self._agg is None:
            self._agg = self._new_aggregator()
        return self._agg

    def all_reduce_async(self, x, op: str = "sum"):
        """Queue an all-reduce of a copy of `x`; packed with others into super-packets of
        `aggregation_bytes` per (dtype, op), sent when full, on flush() or after `max_delay`.
        Returns a handle whose wait() gives the result."""
        check_op(op)
        return self._aggregator().submit(x, op)

    def all_reduce_async_many(self, arrays: Sequence, op: str = "sum"):
        """`all_reduce_async` of every array in one call (one copy into one block, one queueing):
        the batched path for many small requests. Returns one handle whose wait() gives the
        results in order."""
        check_op(op)
        return self._aggregator().submit_many(arrays, op)

    def flush(self, timeout: Optional[float] = None) -> None:
        """Send every queued request now and wait until they are done.

        Args:
            timeout: seconds without a finished request before CommTimeout (None: the group's timeout).
        """
        if self._agg is not None:
            self._agg.flush(timeout)

    def aggregator_stats(self) -> dict:
        """The aggregator's counters (all zero before the first request)."""
        return self._agg.stats() if self._agg is not None else dict(EMPTY_AGGREGATOR_STATS)

    def _close_aggregator(self, what: str) -> bool:
        """Stop the executor (queued requests fail) and mark the group closed as `what`; False if
        it was closed already."""
        if isinstance(self._agg, Closed):
            return False
        if self._agg is not None:
            self._agg.close()
        self._agg = Closed(what)
        return True
