"""DTensor activations between pipeline stages, as upstream's stages exchange them.

Upstream's stages may return DTensors (a `shard_module` output plan, `use_local_output=False`)
and take the previous stage's DTensor, on their own mesh, with the same placements. The stage
runner differentiates a stage with respect to its input, which must be a plain Tensor (MindSpore
differentiates a DTensor argument by its empty storage, not by its shards), so between stages a
DTensor travels as its global value with its placements attached (`to_wire`); the receiving stage
lays it out again on its own mesh (`from_wire`). Both are differentiable (a gather and a slice)
and not accounted: real pipeline ranks send each device's shard, never the gathered value. The
global value only exists where the stages run in one process (the simulation, in process or
per rank); a job with one process per device refuses DTensor activations (`WireRoute`).
"""
from __future__ import annotations

from typing import Optional, Tuple

from mindspore import Tensor

from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.hyper_parallel.distribute import distribute_tensor
from mindspore_hyper.hyper_parallel.session import mesh_of
from mindspore_hyper.shard.placement import Replicate

__all__ = ["WireRoute", "to_wire", "wire_meta", "from_wire", "stage_mesh"]

_META = "_hyper_pipeline_placements"  # attribute of a wire Tensor: (mesh, placements) of its DTensor


class WireRoute:
    """Whether a schedule's stages exchange values in one process (DTensor activations allowed)."""

    def __init__(self):
        self.in_process = True


def to_wire(out, stage_index: int, route: WireRoute):
    """`out` as the plain Tensor a stage sends: a DTensor's global value carrying its mesh and
    placements; a plain Tensor as it is.

    Raises:
        ValueError: a DTensor output where stages run one process per device.
    """
    if not isinstance(out, DTensor):
        return out
    if not route.in_process:
        raise ValueError(f"PipelineStage {stage_index}: its Cell returned a DTensor; with one process per device "
                         f"DTensor activations between stages are not supported yet (they run in simulation): "
                         f"return the local tensor (use_local_output=True, ShardingPlan(return_local_tensor=...))")
    mesh = out.device_mesh
    wire = out.redistribute(mesh, (Replicate(),) * len(out.placements), record=False).to_local()
    setattr(wire, _META, (mesh, tuple(out.placements)))
    return wire


def wire_meta(x) -> Optional[Tuple]:
    """The (mesh, placements) a wire Tensor carries, or None for a plain activation."""
    return getattr(x, _META, None)


def stage_mesh(cell) -> Optional[object]:
    """The mesh of the stage Cell's first laid-out Parameter, or None."""
    for param in cell.trainable_params():
        mesh = mesh_of(param)
        if mesh is not None:
            return mesh
    return None


def from_wire(x: Tensor, meta: Tuple, mesh, stage_index: int) -> DTensor:
    """The DTensor a wire Tensor stands for, laid out on the receiving stage's `mesh` (None: the
    sender's) with the sender's placements (each device takes its piece; no broadcast).

    Raises:
        ValueError: the receiving mesh has another number of dimensions than the placements.
    """
    sender_mesh, placements = meta
    mesh = sender_mesh if mesh is None else mesh
    if mesh.ndim != len(placements):
        raise ValueError(f"PipelineStage {stage_index}: it receives a DTensor with placements {placements} (one per "
                         f"dimension of the sending stage's mesh), but its own mesh {mesh!r} has {mesh.ndim} "
                         f"dimensions; build every stage's mesh with the same shape")
    return distribute_tensor(x, mesh, placements, src_data_rank=None)
