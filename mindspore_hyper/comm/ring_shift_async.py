"""The asynchronous ring shift of the process collectives (msrun): post, compute, wait.

`ProcessCollectives.ring_shift_async(tensors, group, phase)` copies this process's tensors (e.g.
a ring attention step's K and V chunks, or in its backward K, V and their gradient accumulators)
to NumPy in the calling thread and hands them to the group's sender thread, which moves each one
step around the ring -- member i's to member i+1 (mod n), member i-1's arriving -- by an ordered
send/recv (even members send first, odd ones receive first: no cycle of waits). The call returns
a `RingShiftHandle` at once; the caller computes meanwhile (the comm library releases the GIL
while it moves bytes) and `handle.wait()` returns the received tensors. They are plain tensors,
not autograd nodes: their user (ring attention, `mindspore_hyper.dtensor.context_parallel.ring_core`) has
its own backward, which moves the gradients by shifts of its own.

One sender thread per group runs the posted shifts in posting order, so the messages of two
handles never interleave on the group's channels and every rank sees them in the same order; the
caller must wait for a group's handles before it runs any other collective on that group (the
ring loops wait for each step's shift before the next one is posted and at their end).

A transfer's error (a dead peer, a mismatch, the communicator's own timeout) surfaces on `wait`.
`wait(timeout)` raises `CommTimeout` after `timeout` seconds without the transfer completing and
aborts the group (its peers fail fast instead of waiting out their own timeout).

Every completed wait appends a `RingShiftTiming` to the collectives' `ring_timings` (the latest
`RING_TIMINGS_KEPT`): the seconds from post to the transfer's end (`transfer_s`), the seconds
`wait` blocked (`wait_s`) and the phase the caller named ("forward" / "backward"); the fraction
of the transfer hidden behind the caller's compute is 1 - wait_s / transfer_s.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np
from mindspore import Tensor

from mindspore_hyper.comm._common import CommTimeout

__all__ = ["RingShiftHandle", "RingShiftTiming", "RingSender", "hidden_fraction", "RING_TIMINGS_KEPT"]

RING_TIMINGS_KEPT = 4096  # timings a ProcessCollectives keeps (older ones are dropped)


@dataclass(frozen=True)
class RingShiftTiming:
    """One asynchronous ring shift: `transfer_s` seconds from post to the last byte received,
    `wait_s` seconds the caller blocked in `wait`, `nbytes` bytes sent by this process, `phase`
    the pass that posted it ("forward", or "backward" for ring attention's gradient pass)."""

    transfer_s: float
    wait_s: float
    nbytes: int
    phase: str = "forward"


def hidden_fraction(timings: Sequence[RingShiftTiming]) -> float:
    """1 - (total wait) / (total transfer) over `timings` (the share of transfer time spent
    while the caller computed); ValueError when there are none."""
    transfer = sum(t.transfer_s for t in timings)
    if not timings or transfer <= 0:
        raise ValueError("hidden_fraction: no asynchronous ring shift was timed (timings is empty)")
    return 1.0 - sum(t.wait_s for t in timings) / transfer


class _Job:
    """Posted arrays, their shifted copies (or the error) and the time the transfer ended."""

    __slots__ = ("arrays", "results", "error", "finished", "done")

    def __init__(self, arrays: List[np.ndarray]):
        self.arrays = arrays
        self.results: Optional[List[np.ndarray]] = None
        self.error: Optional[BaseException] = None
        self.finished = 0.0
        self.done = threading.Event()


class RingSender:
    """The sender thread of one group: runs `shift(array)` (a blocking ring step) for each
    posted job's arrays, in posting order (a daemon thread, started on the first post)."""

    def __init__(self, shift, name: str):
        self._shift = shift
        self._name = name
        self._jobs: "queue.SimpleQueue[_Job]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None

    def post(self, arrays: List[np.ndarray]) -> _Job:
        job = _Job(arrays)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put(job)
        return job

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.results = [self._shift(a) for a in job.arrays]
            except BaseException as exc:  # handed to the waiting caller
                job.error = exc
            job.finished = time.perf_counter()
            job.done.set()


class RingShiftHandle:
    """A posted ring shift of several tensors (see module docstring).

    Args:
        owner: the collectives whose `ring_timings` get this shift's timing.
        tensors: the posted tensors (the received ones take their dtypes).
        job: the sender thread's job; None for a one-member group (nothing moves).
        what: names the shift in errors.
        phase: the pass that posted it, kept in its timing.
        to_tensor: (received array, posted tensor) -> the received tensor.
        abort: aborts the group on a wait timeout (None where the communicator cannot).
    """

    def __init__(self, owner, tensors: Sequence[Tensor], job: Optional[_Job], what: str, phase: str,
                 to_tensor: Callable[[np.ndarray, Tensor], Tensor], abort: Optional[Callable[[str], None]]):
        self._owner, self._tensors = owner, list(tensors)
        self._job, self._what, self._phase = job, what, phase
        self._to_tensor, self._abort = to_tensor, abort
        self._posted = time.perf_counter()
        self._result: Optional[List[Tensor]] = None

    def done(self) -> bool:
        """Whether the transfer has ended (received, or failed)."""
        return self._job is None or self._job.done.is_set()

    def wait(self, timeout: Optional[float] = None) -> List[Tensor]:
        """The received tensors (member i-1's, in posting order); waiting again returns them again.

        Args:
            timeout: seconds to wait for the transfer (None: until it ends; the communicator's
                own timeout bounds it).

        Raises:
            CommTimeout: `timeout` passed first (the group is aborted).
            CommError: the transfer failed (its error).
        """
        if self._result is not None:
            return self._result
        if self._job is None:  # a one-member group: nothing moves
            self._result = self._tensors
            return self._result
        start = time.perf_counter()
        if not self._job.done.wait(timeout):
            why = f"{self._what}: the transfer did not complete within wait(timeout={timeout}) s"
            if self._abort is not None:
                self._abort(why)
            raise CommTimeout(why)
        waited = time.perf_counter() - start
        if self._job.error is not None:
            raise self._job.error
        self._result = [self._to_tensor(a, x) for x, a in zip(self._tensors, self._job.results)]
        nbytes = sum(a.nbytes for a in self._job.arrays)
        self._owner.ring_timings.append(RingShiftTiming(self._job.finished - self._posted, waited, nbytes,
                                                        self._phase))
        return self._result
