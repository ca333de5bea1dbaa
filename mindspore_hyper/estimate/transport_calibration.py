"""The shared-memory transport's AllReduce cost, measured as the distributed runtime pays it.

`measure_all_reduce(name, rank, size, message_bytes)` runs in each of `size` processes at once
(one group, `ShmCommunicator`): per call, a MindSpore tensor is copied to the host (`asnumpy`),
all-reduced over the group and wrapped back into a Tensor: the communication boundary of the
runtime's collectives. It times a 4-byte message and a `message_bytes` one (the job's message,
e.g. a tensor-parallel activation) and returns the alpha-beta figures of the ring formula
t(n) = 2 (p - 1) alpha + 2 (p - 1) / p x n / bandwidth that pass through both points:
alpha (seconds per step, includes the host copies and waits of a tiny message) and the
bandwidth (bytes/s of the copies and the transport). Those calls start together (a barrier
before each). Given a `compute` callable (the job's work between two collectives), it then times
the 4-byte call as a step pays it: each process computes, then all-reduces, with no barrier, so
a peer that was descheduled or is slower arrives late; the mean excess over the aligned call is
the peer wait per collective (`Efficiency.peer_wait`). The unaligned calls run in `rounds` rounds
and the wait is the median of the rounds' group means: while more processes than cores take
turns, one round can catch a long deschedule that the step does not pay every time (a mean over
all calls moved 2.6x between two calibrations of the same job).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, List, Optional, Tuple

import numpy as np

__all__ = ["measure_all_reduce", "alpha_beta"]


def alpha_beta(size: int, small_bytes: float, small_s: float, large_bytes: float,
               large_s: float) -> Tuple[float, float]:
    """(alpha seconds, bandwidth bytes/s) of the ring all-reduce formula through two timed points.

    Raises:
        ValueError: size < 2, or points that do not grow with the message (named).
    """
    if size < 2:
        raise ValueError(f"size={size!r}: an all-reduce needs >= 2 processes")
    if not (large_bytes > small_bytes and large_s > small_s > 0):
        raise ValueError(f"large_s={large_s!r}, small_s={small_s!r}: expected 0 < small_s < large_s for "
                         f"small_bytes={small_bytes!r} < large_bytes={large_bytes!r}")
    steps, share = 2 * (size - 1), 2 * (size - 1) / size
    bandwidth = share * (large_bytes - small_bytes) / (large_s - small_s)
    alpha = max(small_s - share * small_bytes / bandwidth, 0.0) / steps
    return alpha, bandwidth


def measure_all_reduce(name: str, rank: int, size: int, message_bytes: int, repeats: int = 20,
                       compute: Optional[Callable[[], None]] = None,
                       rounds: int = 5) -> Tuple[float, float, float]:
    """Alpha, bandwidth and peer wait of the group's AllReduce at the boundary (module doc); call in every rank.

    Args:
        name: the group name (the same in every rank; unique per measurement).
        rank, size: this process's rank and the group size (>= 2).
        message_bytes: the large message (float32 elements x 4); >= 8.
        repeats: timed calls per size (median), after 2 warm-up calls.
        compute: the work run before each call of the unaligned phase (None: no peer wait measured).
        rounds: rounds of `repeats` unaligned calls; the wait is the median of their group means.

    Returns:
        (alpha seconds, bandwidth bytes/s, peer wait seconds per collective; 0 without `compute`).

    Raises:
        ValueError: a bad argument (named).
    """
    if message_bytes < 8:
        raise ValueError(f"message_bytes={message_bytes!r}: expected >= 8")
    for arg, value in (("repeats", repeats), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg}={value!r}: expected an int >= 1")
    from mindspore import Tensor

    from mindspore_hyper.comm.shm import ShmCommunicator

    group = ShmCommunicator(name, rank, size)

    def timed(x, before: Callable[[], None]) -> List[float]:
        times: List[float] = []
        for i in range(repeats + 2):
            before()
            start = time.perf_counter()
            Tensor(group.all_reduce(x.asnumpy()))
            if i >= 2:
                times.append(time.perf_counter() - start)
        return times

    try:
        tiny = Tensor(np.ones(1, np.float32))
        aligned = [statistics.median(timed(x, group.barrier))
                   for x in (tiny, Tensor(np.ones(message_bytes // 4, np.float32)))]
        wait = 0.0
        if compute is not None:
            # per round, the mean over every rank of the group: the step pays each rank's waits in turn
            means = []
            for _ in range(rounds):
                mine = statistics.fmean(timed(tiny, compute)) - aligned[0]
                means.append(float(group.all_reduce(np.array([mine], np.float64))[0]) / size)
            wait = max(statistics.median(means), 0.0)
    finally:
        group.close()
    alpha, bandwidth = alpha_beta(size, 4, aligned[0], message_bytes, max(aligned[1], aligned[0] * (1 + 1e-9)))
    return alpha, bandwidth, wait
