"""The process's place in a distributed job: its rank, the job size, and its communicators.

Under msrun every worker has RANK_ID and MS_WORKER_NUM; msrun also runs the script once as a
scheduler (MS_ROLE=MS_SCHED), which has nothing to compute: with the shared-memory transport it
exits at once, with MindSpore's transport it serves the cluster inside `mindspore.communication.init()`.
A plain `python script.py` is a job of one process.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Dict, Tuple

from mindspore_hyper.context import get_context

__all__ = ["World", "world"]


@dataclass
class World:
    """This process in its job.

    Attributes:
        rank: this process's global rank.
        size: number of worker processes.
        job: a name shared by the job's processes (it names their shared-memory segments).
        transport: "shm" or "mindspore" (the `dist_transport` flag when the world was made).
        timeout: seconds without progress before a collective fails (`comm_timeout` flag).
    """

    rank: int
    size: int
    job: str
    transport: str
    timeout: float
    _communicators: Dict[Tuple[int, ...], object] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls) -> "World":
        """The world of this process (exits the msrun scheduler process, see module docstring).

        Raises:
            ValueError: inconsistent RANK_ID / MS_WORKER_NUM.
        """
        transport = get_context("dist_transport")
        timeout = get_context("comm_timeout")
        under_msrun = "MS_ROLE" in os.environ
        if under_msrun and transport == "mindspore":
            _mindspore_init()
        if os.environ.get("MS_ROLE") == "MS_SCHED":
            sys.exit(0)  # msrun's scheduler: no device of its own
        rank = int(os.environ.get("RANK_ID", "0"))
        size = int(os.environ.get("MS_WORKER_NUM", os.environ.get("RANK_SIZE", "1")))
        if not 0 <= rank < size:
            raise ValueError(f"RANK_ID={rank} is outside MS_WORKER_NUM={size}: launch with msrun --worker_num=N")
        job = f"{os.environ.get('MS_SCHED_HOST', 'local')}_{os.environ.get('MS_SCHED_PORT', os.getpid())}"
        return cls(rank, size, job.replace("/", "_").replace(".", "_"), transport, timeout)

    def communicator(self, ranks: Tuple[int, ...]):
        """The communicator of the group of global `ranks` (made collectively on first use by
        every member: all members must ask for it, in the same order of groups)."""
        ranks = tuple(int(r) for r in ranks)
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} asked for the communicator of group {ranks}, which it is not in")
        if ranks not in self._communicators:
            self._communicators[ranks] = self._make(ranks)
        return self._communicators[ranks]

    def _make(self, ranks: Tuple[int, ...]):
        if self.transport == "mindspore":
            from mindspore_hyper.comm.mindspore_transport import MindSporeCommunicator

            return MindSporeCommunicator(ranks=ranks, shm_timeout=self.timeout)
        from mindspore_hyper.comm.shm import ShmCommunicator

        name = f"{self.job}_g{'-'.join(map(str, ranks))}"
        return ShmCommunicator(name, ranks.index(self.rank), len(ranks), timeout=self.timeout)

    def close(self) -> None:
        """Close every communicator (also done at interpreter exit)."""
        for comm in self._communicators.values():
            comm.close()
        self._communicators.clear()


def _mindspore_init() -> None:
    from mindspore.communication import init

    init()


_WORLD = None


def world() -> World:
    """This process's World (made on first use)."""
    global _WORLD
    if _WORLD is None:
        import atexit

        _WORLD = World.from_env()
        atexit.register(_WORLD.close)
    return _WORLD
