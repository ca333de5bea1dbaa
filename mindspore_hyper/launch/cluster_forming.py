"""A cluster that does not form is not silent on the console of `mindspore-hyper run --processes`.

While a worker waits for the others to register, MindSpore 2.10 writes "Topology build timed out.,
retry(n/m)." to its log every 0.5 s (m = msrun's `--cluster_time_out` / 0.5 s: 1200 by default).
At a normal start a worker writes a few of them, and `WorkerConsole` drops them (`HARMLESS_LINES`).
A cluster that never forms (a rank that did not start, a wrong `--master_addr`/`--master_port`)
writes them until retry m, then the worker fails; without this watch the console stayed silent
until then. `ClusterFormingWatch` turns the notices into one console line each time the job's
retries reach another multiple of `every`, with only what the lines say: the retry count and its
limit, the workers waiting (their log files' ranks) and the seconds between the first notice and
this one (the lines' timestamps).
"""
from __future__ import annotations

import re
from datetime import datetime
from typing import Dict, Optional, Tuple

__all__ = ["RETRIES_PER_NOTICE", "ClusterFormingWatch", "retry_of"]

RETRIES_PER_NOTICE = 20  # 10 s at MindSpore's 0.5 s between retries: past a normal start on a busy machine

_RETRY = re.compile(r"^\[WARNING\] DISTRIBUTED\(\d+[,:][0-9a-f]+,python\):(?P<time>\d{4}-\d\d-\d\d-[0-9:]{8})"
                    r"\.(?P<ms>\d+)\.(?P<us>\d+) \[mindspore/ccsrc/cluster/topology/cluster_context\.cc:\d+\] "
                    r"BuildCluster\] Topology build timed out\., retry\((?P<n>\d+)/(?P<m>\d+)\)\.$")


def retry_of(line: str) -> Optional[Tuple[int, int, float]]:
    """What a "Topology build timed out., retry(n/m)." line of MindSpore's log says.

    Args:
        line: one log line, without its newline.

    Returns:
        (retry n, limit m, the line's timestamp in seconds; only differences are meaningful), or
        None for any other line.
    """
    match = _RETRY.match(line)
    if match is None:
        return None
    stamp = datetime.strptime(match["time"], "%Y-%m-%d-%H:%M:%S").timestamp()
    return int(match["n"]), int(match["m"]), stamp + int(match["ms"]) / 1e3 + int(match["us"]) / 1e6


class ClusterFormingWatch:
    """Reads the workers' log lines; says when the cluster is slow to form (see module docstring).

    Args:
        every: retries between two console lines (the first at retry `every`).

    Raises:
        ValueError: `every` is not a positive int.
    """

    def __init__(self, every: int = RETRIES_PER_NOTICE):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every={every!r}: expected an int >= 1 (retries between two console lines)")
        self.every = every
        self._next = every
        self._first: Optional[float] = None  # time of the job's first retry notice (seconds)
        self._latest: Dict[int, int] = {}  # worker rank -> its latest retry number

    def feed(self, worker: int, line: str) -> Optional[str]:
        """Read one log line.

        Args:
            worker: the number of the worker whose log holds the line (`worker_<n>.log`).
            line: the line, without its newline.

        Returns:
            The console line to print (the job's retries reached the next multiple of `every`),
            or None.
        """
        retry = retry_of(line)
        if retry is None:
            return None
        n, limit, when = retry
        self._first = when if self._first is None else min(self._first, when)
        self._latest[worker] = n
        if n < self._next:
            return None
        while self._next <= n:
            self._next += self.every
        waiting = ", ".join(f"worker {w} at retry {k}" for w, k in sorted(self._latest.items()))
        return (f"waiting for the cluster to form: retry {n} of {limit} (MindSpore's 'Topology build timed out' "
                f"notices, {when - self._first:.1f} s since the first; {waiting}); check --master_addr/--master_port "
                f"and that every rank started")
