"""The process's place in a distributed job: its rank, the job size, and its communicators.

Under msrun every worker has RANK_ID and MS_WORKER_NUM; msrun also runs the script once as a
scheduler (MS_ROLE=MS_SCHED), which has nothing to compute: with the shared-memory transport it
exits at once, with MindSpore's transport it serves the cluster inside `mindspore.communication.init()`.
A plain `python script.py` is a job of one process.

With the hybrid transport (several hosts) every process learns each rank's host at start (one
all-gather of hostname digests through MindSpore); a group whose ranks share one host talks over
shared memory, any other group through MindSpore.

The job's shared-memory segments are named with its token (`comm.job_token`): from the
launcher's environment (MSHYPER_JOB_TOKEN), else under msrun by a rendezvous that
`World.from_env` starts -- each host's local rank 0 publishes the token in a private file, the
host's other workers wait for it -- so that every rank has it before its first communicator.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Optional, Tuple

from mindspore_hyper.comm.job_token import job_token
from mindspore_hyper.comm.msrun_scheduler import scheduler_left
from mindspore_hyper.context import get_context
from mindspore_hyper.runtime.distributed.cpu_binding import bind_to_cores
from mindspore_hyper.runtime.distributed.sub_world import SubWorld

__all__ = ["World", "world"]


@dataclass
class World:
    """This process in its job.

    Attributes:
        rank: this process's global rank.
        size: number of worker processes.
        job: a name shared by the job's processes (with the job token, it names their
            shared-memory segments).
        transport: "shm", "mindspore" or "hybrid" (the `dist_transport` flag when the world was made).
        timeout: seconds without progress before a collective fails (`comm_timeout` flag).
        hosts: a digest of every rank's hostname, by rank (hybrid transport; else empty).
        cores: the cores this process was bound to (flag `cpu_binding`), or None where it was
            left as it was.
    """

    rank: int
    size: int
    job: str
    transport: str
    timeout: float
    hosts: Tuple[int, ...] = ()
    cores: Optional[FrozenSet[int]] = None
    _communicators: Dict[Tuple[int, ...], object] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls) -> "World":
        """The world of this process (exits the msrun scheduler process, see module docstring).

        Raises:
            ValueError: inconsistent RANK_ID / MS_WORKER_NUM.
            TimeoutError: under msrun, local rank 0 did not publish the job token within the timeout.
        """
        transport = get_context("dist_transport")
        timeout = get_context("comm_timeout")
        under_msrun = "MS_ROLE" in os.environ
        if under_msrun and transport in ("mindspore", "hybrid"):
            if scheduler_left():
                raise ValueError(f"dist_transport={transport!r} needs msrun's scheduler, but the script let it go "
                                 "(exit_if_msrun_scheduler() ran with the shared-memory transport): set "
                                 "dist_transport before calling it")
            _mindspore_init(timeout)
        if os.environ.get("MS_ROLE") == "MS_SCHED":
            sys.exit(0)  # msrun's scheduler: no device of its own
        rank = int(os.environ.get("RANK_ID", "0"))
        size = int(os.environ.get("MS_WORKER_NUM", os.environ.get("RANK_SIZE", "1")))
        if not 0 <= rank < size:
            raise ValueError(f"RANK_ID={rank} is outside MS_WORKER_NUM={size}: launch with msrun --worker_num=N")
        job = f"{os.environ.get('MS_SCHED_HOST', 'local')}_{os.environ.get('MS_SCHED_PORT', os.getpid())}"
        hosts = _host_digests(size) if transport == "hybrid" and under_msrun else ()
        job_token(timeout)  # local rank 0 publishes it, the others wait for it (or it came with the environment)
        made = cls(rank, size, job.replace("/", "_").replace(".", "_"), transport, timeout, hosts)
        made.cores = made._bind_cores()
        return made

    def communicator(self, ranks: Tuple[int, ...]):
        """The communicator of the group of global `ranks` (made collectively on first use by
        every member: all members must ask for it, in the same order of groups)."""
        ranks = tuple(int(r) for r in ranks)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"World.sub(ranks={ranks}): a rank appears twice")
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} asked for the communicator of group {ranks}, which it is not in")
        if ranks not in self._communicators:
            self._communicators[ranks] = self._make(ranks)
        return self._communicators[ranks]

    def sub(self, ranks: Tuple[int, ...]) -> SubWorld:
        """The processes of global `ranks` as a world of their own (see `SubWorld`).

        Raises:
            ValueError: a rank appears twice, this process is not one of `ranks`, or a rank is outside
                the job.
        """
        ranks = tuple(int(r) for r in ranks)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"World.sub(ranks={ranks}): a rank appears twice")
        if self.rank not in ranks:
            raise ValueError(f"World.sub(ranks={ranks}): this process (rank {self.rank}) is not one of them")
        outside = [r for r in ranks if not 0 <= r < self.size]
        if outside:
            raise ValueError(f"World.sub(ranks={ranks}): rank {outside[0]} is outside the job's {self.size} processes")
        return SubWorld(self, ranks)

    def one_host(self, ranks: Tuple[int, ...]) -> bool:
        """Whether the processes of `ranks` run on one host (always, outside the hybrid transport)."""
        return not self.hosts or len({self.hosts[r] for r in ranks}) == 1

    def _make(self, ranks: Tuple[int, ...]):
        if self.transport == "mindspore" or not self.one_host(ranks):
            from mindspore_hyper.comm.mindspore_transport import MindSporeCommunicator

            return MindSporeCommunicator(ranks=ranks, shm_timeout=self.timeout)
        from mindspore_hyper.comm.shm import ShmCommunicator

        name = f"{self.job}_g{'-'.join(map(str, ranks))}"
        return ShmCommunicator(name, ranks.index(self.rank), len(ranks), timeout=self.timeout)

    def _bind_cores(self) -> Optional[FrozenSet[int]]:
        """Bind this process to its cores (flag `cpu_binding`, see cpu_binding.py) where the job's
        processes on this host are known: every rank with the shared-memory transport, the ranks
        of this host with the hybrid one; not with MindSpore's transport (hosts unknown)."""
        if get_context("cpu_binding") == "none" or self.transport == "mindspore":
            return None
        local = [r for r in range(self.size) if not self.hosts or self.hosts[r] == self.hosts[self.rank]]
        return bind_to_cores(local.index(self.rank), len(local))

    def close(self) -> None:
        """Close every communicator (also done at interpreter exit)."""
        for comm in self._communicators.values():
            comm.close()
        self._communicators.clear()


def _mindspore_init(timeout: float) -> None:
    """`mindspore.communication.init()`, its cluster declaring a silent process dead after
    `timeout` seconds (MS_NODE_TIMEOUT, unless set already) as our collectives do."""
    from mindspore.communication import init

    os.environ.setdefault("MS_NODE_TIMEOUT", str(max(1, round(timeout))))
    init()


def _host_digests(size: int) -> Tuple[int, ...]:
    """Every rank's hostname digest (an all-gather through MindSpore, before any communicator)."""
    import hashlib
    import socket

    import mindspore as ms
    import numpy as np
    from mindspore.mint import distributed as dist

    mine = np.frombuffer(hashlib.sha256(socket.gethostname().encode()).digest()[:4], np.int32).copy()
    outs = [ms.Tensor(np.zeros(1, np.int32)) for _ in range(size)]
    dist.all_gather(outs, ms.Tensor(mine))
    return tuple(int(o.asnumpy()[0]) for o in outs)


_WORLD = None


def world() -> World:
    """This process's World (made on first use)."""
    global _WORLD
    if _WORLD is None:
        import atexit

        _WORLD = World.from_env()
        atexit.register(_WORLD.close)
    return _WORLD
