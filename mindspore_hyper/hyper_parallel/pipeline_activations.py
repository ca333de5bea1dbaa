"""DTensor activations between pipeline stages, as upstream's stages exchange them.

Upstream's stages may return DTensors (a `shard_module` output plan, `use_local_output=False`)
and take the previous stage's DTensor, on their own mesh, with the same placements. The stage
runner differentiates a stage with respect to its input, which must be a plain Tensor (MindSpore
differentiates a DTensor argument by its empty storage, not by its shards), so between stages a
DTensor travels as a plain Tensor with its layout attached (`to_wire`), and the receiving stage
lays it out again on its own mesh (`from_wire`). Two routes (`WireRoute`):

- a process or thread holds every device of a pipeline rank (the simulation: all pipeline ranks in
  `run_ranks_in_process`, one per thread in the per-rank simulation, which simulates each
  thread's whole block): the DTensor's global value with its mesh and placements; the receiving
  stage takes each device's piece of it. A gather and a slice, both differentiable and not
  accounted: real pipeline ranks send each device's shard, never the gathered value.
- each process is one device (msrun): the device's local piece, with a
  header of ints (mesh shape, global shape, placements) that travels beside it to the matching
  device of the next block (`stage_transport.attach_header`); the receiving rank makes it a DTensor
  with `DTensor.from_local` over its stage's mesh (the mesh of its laid-out Parameters; it must
  have the sender's shape). The gradient goes back as the local piece of the input's gradient,
  which is what the sender's `to_local()` takes in its backward. Shard and Replicate placements
  travel so; a Partial one is refused (the receiving rank would need the peers' pieces' sum to
  give its gradient a meaning): reduce it first (`reduce_partial()` or `redistribute`).

A rank-local output (a style's `use_local_output=True` view of a sharded output, which is a
DTensor in every mode) is each device's own plain tensor: under msrun it travels as that tensor
(no header, as upstream's local tensors); in the simulation it is refused, named.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from mindspore import Tensor, ops

from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.hyper_parallel.distribute import distribute_tensor
from mindspore_hyper.hyper_parallel.session import mesh_of
from mindspore_hyper.pipeline.stage_transport import attach_header, header_of
from mindspore_hyper.shard.placement import Replicate, Shard

__all__ = ["WireRoute", "WireLayout", "to_wire", "global_value", "wire_meta", "from_wire", "stage_mesh"]

_META = "_hyper_pipeline_layout"  # attribute of a global-value wire Tensor: its WireLayout
_MAX_HEADER = 63  # meta ints a channel message carries beside its flag (comm.p2p's limit, 64)


class WireRoute:
    """How a schedule's stages exchange DTensor activations (see module docstring):
    `local_pieces` is True where each process is one device (msrun)."""

    def __init__(self):
        self.local_pieces = False


@dataclass(frozen=True)
class WireLayout:
    """The layout an activation had on the sending stage.

    Attributes:
        placements: one per dimension of the sender's mesh.
        mesh_shape: the sender's mesh shape.
        global_shape: the DTensor's global shape (local pieces only; None: the wire is the global value).
        sender_mesh: the sender's DeviceMesh (global values only, in the one process that holds both).
    """

    placements: Tuple
    mesh_shape: Tuple[int, ...]
    global_shape: Optional[Tuple[int, ...]] = None
    sender_mesh: Optional[object] = None


def global_value(out: DTensor) -> Tensor:
    """`out`'s global value as a plain Tensor (differentiable; not accounted)."""
    mesh = out.device_mesh
    return out.redistribute(mesh, (Replicate(),) * len(out.placements), record=False).to_local()


def to_wire(out, stage_index: int, route: WireRoute):
    """`out` as the plain Tensor a stage sends (see module docstring); a plain Tensor as it is.

    Raises:
        ValueError: (local pieces) a placement other than Shard or Replicate, or a layout too
            large for the header; (global values) a local output that differs per device.
    """
    if not isinstance(out, DTensor):
        return out
    if out.layout.is_rank_local:  # a style's use_local_output view of a sharded output: each device's own tensor
        return _rank_local_wire(out, stage_index, route)
    placements = tuple(out.placements)
    mesh_shape = tuple(out.device_mesh.shape)
    if not route.local_pieces:
        wire = global_value(out)
        setattr(wire, _META, WireLayout(placements, mesh_shape, sender_mesh=out.device_mesh))
        return wire
    header = [len(mesh_shape), *mesh_shape, len(out.global_shape), *out.global_shape]
    for placement in placements:
        if isinstance(placement, Shard):
            header += [1, placement.dim % len(out.global_shape)]
        elif isinstance(placement, Replicate):
            header += [0, 0]
        else:
            raise ValueError(f"PipelineStage {stage_index}: its Cell returned a DTensor with placements {placements}; "
                             f"with one process per device a {placement!r} activation cannot travel to the next "
                             f"stage (only Shard and Replicate do): reduce it first (out.reduce_partial(), or "
                             f"out.redistribute(mesh, [Replicate()/Shard(d), ...]))")
    if len(header) > _MAX_HEADER:
        raise ValueError(f"PipelineStage {stage_index}: its DTensor output's layout (mesh {mesh_shape}, shape "
                         f"{tuple(out.global_shape)}) needs {len(header)} header ints; at most {_MAX_HEADER} travel")
    local = out.to_local()
    return attach_header(ops.reshape(local, local.shape), header)  # a new Tensor: the shard itself stays unmarked


def _rank_local_wire(out: DTensor, stage_index: int, route: WireRoute) -> Tensor:
    """A rank-local output as the plain Tensor it is on this device (under msrun: its one piece).

    Raises:
        ValueError: where one process or thread holds several devices' pieces (the simulation).
    """
    if not route.local_pieces or len(out.shards) != 1:
        raise ValueError(f"PipelineStage {stage_index}: its Cell returned a local tensor that differs per device "
                         f"(a style's use_local_output=True view of a sharded output); in the simulation it cannot "
                         f"travel to the next stage as one tensor: return the DTensor (use_local_output=False), "
                         f"which travels with its placements (under msrun each device sends its own tensor)")
    (piece,) = out.shards.values()
    return piece


def wire_meta(x) -> Optional[WireLayout]:
    """The WireLayout a received Tensor carries, or None for a plain activation."""
    meta = getattr(x, _META, None)
    if meta is not None:
        return meta
    header = header_of(x)
    if header is None:
        return None
    k = header[0]
    mesh_shape = tuple(header[1:1 + k])
    n = header[1 + k]
    global_shape = tuple(header[2 + k:2 + k + n])
    codes = header[2 + k + n:]
    placements = tuple(Shard(codes[2 * i + 1]) if codes[2 * i] == 1 else Replicate() for i in range(k))
    return WireLayout(placements, mesh_shape, global_shape)


def stage_mesh(cell) -> Optional[object]:
    """The mesh of the stage Cell's first laid-out Parameter, or None."""
    for param in cell.trainable_params():
        mesh = mesh_of(param)
        if mesh is not None:
            return mesh
    return None


def from_wire(x: Tensor, meta: WireLayout, mesh, stage_index: int) -> DTensor:
    """The DTensor a received Tensor stands for, on the receiving stage's `mesh` with the
    sender's placements: a global value laid out there (`mesh` None: the sender's mesh), or this
    rank's local piece made a DTensor of the sender's global shape.

    Raises:
        ValueError: the receiving mesh does not match the sender's (named), or (local pieces) the
            stage has no laid-out Parameter to tell its mesh.
    """
    placements = meta.placements
    if meta.global_shape is None:
        mesh = meta.sender_mesh if mesh is None else mesh
        if mesh.ndim != len(placements):
            raise ValueError(f"PipelineStage {stage_index}: it receives a DTensor with placements {placements} (one "
                             f"per dimension of the sending stage's mesh), but its own mesh {mesh!r} has {mesh.ndim} "
                             f"dimensions; build every stage's mesh with the same shape")
        return distribute_tensor(x, mesh, placements, src_data_rank=None)
    if mesh is None:
        raise ValueError(f"PipelineStage {stage_index}: it receives a DTensor activation (placements {placements} on "
                         f"a mesh of shape {meta.mesh_shape}), but none of its Parameters is laid out on a mesh, so "
                         f"with one process per device it has no mesh to take it on: lay its Parameters out on its "
                         f"block's mesh (distribute_module / parallelize_module), or return a local tensor from the "
                         f"previous stage (use_local_output=True)")
    if tuple(mesh.shape) != meta.mesh_shape:
        raise ValueError(f"PipelineStage {stage_index}: it receives a DTensor laid out on a mesh of shape "
                         f"{meta.mesh_shape} (placements {placements}), but its own mesh {mesh!r} has shape "
                         f"{tuple(mesh.shape)}; build every stage's mesh with the same shape")
    return DTensor.from_local(x, mesh, placements, shape=meta.global_shape)
