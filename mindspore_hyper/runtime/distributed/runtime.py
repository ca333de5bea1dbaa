"""The distributed runtime: one process per mesh device, launched by msrun."""
from __future__ import annotations

from typing import Tuple

import numpy as np
from mindspore import Parameter, Tensor

from mindspore_hyper.comm.process_collectives import ProcessCollectives
from mindspore_hyper.dtensor.execution import ParameterSlot
from mindspore_hyper.runtime.base import OpByOpRuntime
from mindspore_hyper.runtime.distributed.world import world
from mindspore_hyper.runtime.simulation.runtime import zero_axes
from mindspore_hyper.shard.layout import Layout

__all__ = ["DistributedRuntime", "local_shard_slot"]


def local_shard_slot(network, param, row, rank: int, value: np.ndarray) -> ParameterSlot:
    """Keep only `rank`'s shard of `value` (the parameter's global initial value): a new Parameter
    of the same name holding it replaces `param` in every Cell of `network` that holds it."""
    local = np.require(value[row.layout.rank_slices(rank, row.global_shape)], requirements="C")
    shard = Parameter(Tensor(local, dtype=param.dtype), name=param.name, requires_grad=param.requires_grad)
    for _, cell in network.cells_and_names():
        for key, held in list(cell._params.items()):
            if held is param:
                cell._params[key] = shard
    return ParameterSlot(shard, row.layout, row.global_shape, zero_axes(row), local=True)


class DistributedRuntime(OpByOpRuntime):
    """This process holds one rank of the mesh: its rank in `processes` (the whole job, its msrun
    rank; or a SubWorld: a pipeline stage's or an MPMD group's processes); collectives go through
    the `dist_transport` flag's transport.

    Args:
        processes: the World or SubWorld the mesh's ranks run on; None: the job's World.
        broadcast_parameters: every process starts from the processes' rank 0 initial values (one
            broadcast per parameter); False when they are equal already (a pipeline build
            broadcast them beforehand).
    """

    name = "distributed"

    def __init__(self, processes=None, broadcast_parameters: bool = True):
        self._processes = processes
        self.broadcast_parameters = broadcast_parameters

    @property
    def processes(self):
        """The World or SubWorld of this runtime (the job's World made on first use)."""
        return self._processes if self._processes is not None else world()

    def local_ranks(self, mesh: Layout) -> Tuple[int, ...]:
        return (self.processes.rank,)

    def make_collectives(self, mesh: Layout):
        return ProcessCollectives(self.processes.communicator)

    def materialize(self, network, param, row) -> ParameterSlot:
        """This process keeps only its shard of the initial value: a new Parameter of the same
        name holding it replaces the global one in every Cell of `network` that holds it."""
        p = self.processes
        value = param.asnumpy()
        if self.broadcast_parameters and p.size > 1:
            value = p.communicator(tuple(range(p.size))).broadcast(value, 0)
        return local_shard_slot(network, param, row, p.rank, value)

    def device_count(self) -> int:
        return self.processes.size

    def holds_all_ranks(self) -> bool:
        return self.processes.size == 1

    def in_one_process(self) -> bool:
        """False: each process runs its own devices (even a job of one process)."""
        return False

    def sub_runtime(self, ranks, same_initial_values: bool = False) -> "DistributedRuntime":
        """The runtime of the processes `ranks` (a SubWorld of this one; see `Runtime.sub_runtime`)."""
        return DistributedRuntime(self.processes.sub(tuple(ranks)), broadcast_parameters=not same_initial_values)

    def gather_values(self, array: np.ndarray) -> np.ndarray:
        """Every process's `array` stacked in process order (an all-gather over the processes)."""
        p = self.processes
        if p.size == 1:
            return np.asarray(array)[None]
        return p.communicator(tuple(range(p.size))).all_gather(np.asarray(array)[None], dim=0)

    def broadcast_values(self, array: np.ndarray, root: int) -> np.ndarray:
        """Process `root`'s `array` on every process (a broadcast over the processes)."""
        p = self.processes
        return p.communicator(tuple(range(p.size))).broadcast(array, root)

    def device_count_text(self, count: int) -> str:
        return f"the job has {count} processes"

    def device_count_hint(self, mesh_size: int) -> str:
        return f"launch with msrun --worker_num={mesh_size} --local_worker_num={mesh_size}"

    def wrap(self, model, table, return_dtensor: bool):
        """A `DistributedModel` for this process's rank."""
        from mindspore_hyper.runtime.distributed.distributed_model import DistributedModel

        return DistributedModel(model, table, self, return_dtensor=return_dtensor)
