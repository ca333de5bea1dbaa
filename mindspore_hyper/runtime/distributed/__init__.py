"""Distributed mode: one process per mesh device under msrun, the simulation's DTensor with one
local shard, collectives over shared memory (one host) or MindSpore's transport."""
from mindspore_hyper.runtime.distributed.distributed_model import DistributedModel
from mindspore_hyper.runtime.distributed.runtime import DistributedRuntime
from mindspore_hyper.runtime.distributed.world import World, world

__all__ = ["DistributedModel", "DistributedRuntime", "World", "world"]
