"""The distributed runtime of one pipeline stage's data/tensor sub-mesh under msrun.

The stage's mesh numbers its devices 0..n-1 (a Layout's ranks are always a permutation of
range(n)); `StageWorld` maps those stage ranks to the global ranks of the processes running the
stage, so the DistributedModel of a stage talks to exactly its stage's processes. Only those
processes build that stage, so the parameter broadcast of `DistributedRuntime.materialize` (a
collective over every process) cannot run here: the pipeline build broadcast every Parameter
from rank 0 beforehand, and this runtime only keeps the local shard.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
from mindspore import Parameter, Tensor

from mindspore_hyper.comm.process_collectives import ProcessCollectives
from mindspore_hyper.dtensor.execution import ParameterSlot
from mindspore_hyper.runtime.distributed.runtime import DistributedRuntime
from mindspore_hyper.runtime.simulation.runtime import zero_axes
from mindspore_hyper.shard.layout import Layout

__all__ = ["StageWorld", "StageDistributedRuntime"]


@dataclass
class StageWorld:
    """One stage's processes seen as a world of their own.

    Attributes:
        world: the job's World.
        ranks: the global rank of each stage rank (stage rank = position).
    """

    world: object
    ranks: Tuple[int, ...]

    @property
    def rank(self) -> int:
        return self.ranks.index(self.world.rank)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def timeout(self) -> float:
        return self.world.timeout

    def communicator(self, ranks: Tuple[int, ...]):
        """The job's communicator of the processes at these stage ranks."""
        return self.world.communicator(tuple(self.ranks[int(r)] for r in ranks))


class StageDistributedRuntime(DistributedRuntime):
    """DistributedRuntime over a StageWorld; `materialize` keeps the local shard without a broadcast."""

    def __init__(self, stage_world: StageWorld):
        self.stage_world = stage_world

    def local_ranks(self, mesh: Layout) -> Tuple[int, ...]:
        return (self.stage_world.rank,)

    def make_collectives(self, mesh: Layout):
        return ProcessCollectives(self.stage_world.communicator)

    def materialize(self, network, param, row) -> ParameterSlot:
        value = param.asnumpy()
        local = np.require(value[row.layout.rank_slices(self.stage_world.rank, row.global_shape)], requirements="C")
        shard = Parameter(Tensor(local, dtype=param.dtype), name=param.name, requires_grad=param.requires_grad)
        for _, cell in network.cells_and_names():
            for key, held in list(cell._params.items()):
                if held is param:
                    cell._params[key] = shard
        return ParameterSlot(shard, row.layout, row.global_shape, zero_axes(row), local=True)
