"""The distributed runtime: one process per mesh device, launched by msrun."""
from __future__ import annotations

from typing import Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor

from mindspore_hyper.comm.process_collectives import ProcessCollectives
from mindspore_hyper.dtensor.execution import ParameterSlot
from mindspore_hyper.runtime.base import Runtime, register_runtime
from mindspore_hyper.runtime.distributed.world import world
from mindspore_hyper.runtime.simulation.runtime import zero_axes
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.strategy.resolve import resolve_strategy

__all__ = ["DistributedRuntime"]


@register_runtime
class DistributedRuntime(Runtime):
    """This process holds the mesh rank equal to its msrun rank; collectives go through the
    `dist_transport` flag's transport."""

    name = "distributed"

    def local_ranks(self, mesh: Layout) -> Tuple[int, ...]:
        return (world().rank,)

    def make_collectives(self, mesh: Layout):
        return ProcessCollectives(world().communicator)

    def materialize(self, network, param, row) -> ParameterSlot:
        """Every process starts from rank 0's initial values (as if one model had been built) and
        keeps only its shard: a new Parameter of the same name holding the local shard replaces
        the global one in every Cell of `network` that holds it."""
        w = world()
        value = param.asnumpy()
        if w.size > 1:
            value = w.communicator(tuple(range(w.size))).broadcast(value, 0)
        local = np.require(value[row.layout.rank_slices(w.rank, row.global_shape)], requirements="C")
        shard = Parameter(Tensor(local, dtype=param.dtype), name=param.name, requires_grad=param.requires_grad)
        for _, cell in network.cells_and_names():
            for key, held in list(cell._params.items()):
                if held is param:
                    cell._params[key] = shard
        return ParameterSlot(shard, row.layout, row.global_shape, zero_axes(row), local=True)

    def parallelize(self, model, strategy_or_config, return_dtensor: bool = False, optimizer_states: int = 2,
                    group_strategies=None):
        """Wrap `model` for this process's rank (see DistributedModel); a config with device
        groups (hyper_mpmd on) gives an `MPMDModel` running this process's group.

        Raises:
            ValueError: GRAPH_MODE, or the strategy's mesh size differs from the job's process count.
        """
        from mindspore_hyper.runtime.distributed.model import DistributedModel

        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            raise ValueError("distributed mode runs op by op: call mindspore.set_context(mode=mindspore.PYNATIVE_MODE)")
        w = world()
        table = resolve_strategy(model, strategy_or_config, optimizer_states=optimizer_states)
        if table.groups:
            from mindspore_hyper.runtime.mpmd.distributed import parallelize_groups

            return parallelize_groups(model, table, self, group_strategies, optimizer_states)
        if group_strategies:
            raise ValueError("group_strategies: the strategy declares no device groups (process_groups or "
                             "strategy: mpmd entries)")
        if table.mesh.size != w.size:
            raise ValueError(f"the strategy's mesh {table.mesh.device_matrix} has {table.mesh.size} devices but the job "
                             f"has {w.size} processes; launch with msrun --worker_num={table.mesh.size} "
                             f"--local_worker_num={table.mesh.size}")
        for row in table:
            row.layout.check_shape(row.global_shape)
        return DistributedModel(model, table, self, return_dtensor=return_dtensor)
