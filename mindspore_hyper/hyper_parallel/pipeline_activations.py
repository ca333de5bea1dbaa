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
  header of ints (the sender's mesh: shape, ranks relative to the sending rank, dimension names;
  the global shape; the placements) that travels beside it to the matching device of the next
  block (`stage_transport.attach_header`); the receiving rank makes it a DTensor with
  `DTensor.from_local` over its stage's mesh (the mesh of its laid-out Parameters; it must have
  the sender's shape; a stage without one takes the sender's mesh moved to its own block, as
  upstream's receiving stage rebuilds the sender's layout on its block's ranks). The gradient goes
  back as the local piece of the input's gradient, which is what the sender's `to_local()` takes in
  its backward. Shard, Replicate and Partial placements travel so. A Partial activation's pieces
  travel as they are, as upstream's (its layout, Partial included, travels with the local
  tensor): the receiver's DTensor is Partial, and the gradient each piece gets back is the
  gradient of the reduced value (for "sum" the same to every piece, as torch's `from_local`
  backward keeps a Partial's gradient replicated), which the receiver's own reduction's backward
  gives.

Where a process or thread is one rank (msrun, the per-rank simulation), a receiving stage without
a laid-out Parameter takes the sender's mesh moved to its own block (the sender's ranks plus the
receiving rank minus the sending one: the two are at the same position of their blocks); where
one process holds every rank (`run_ranks_in_process`) it takes the sender's mesh itself.

A rank-local output (a style's `use_local_output=True` view of a sharded output, which is a
DTensor in every mode) is each device's own plain tensor: under msrun it travels as that tensor
(no header, as upstream's local tensors); in the simulation it is refused, named.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
from mindspore import Tensor, ops

from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh
from mindspore_hyper.hyper_parallel.distribute import distribute_tensor
from mindspore_hyper.hyper_parallel.session import job_ranks_of, mesh_of
from mindspore_hyper.pipeline.stage_transport import attach_header, header_of
from mindspore_hyper.shard.placement import REDUCE_OPS, Partial, Replicate, Shard

__all__ = ["WireRoute", "WireLayout", "to_wire", "global_value", "wire_meta", "from_wire", "received_mesh",
           "stage_mesh"]

_META = "_hyper_pipeline_layout"  # attribute of a global-value wire Tensor: its WireLayout
_MAX_HEADER = 63  # meta ints a channel message carries beside its flag (comm.p2p's limit, 64)


class WireRoute:
    """How a schedule's stages exchange DTensor activations (see module docstring):
    `local_pieces` is True where each process is one device (msrun); `rank` is the job rank of
    this process or thread where it is one rank (msrun, the per-rank simulation), None where one
    process holds every rank."""

    def __init__(self):
        self.local_pieces = False
        self.rank: Optional[int] = None


@dataclass(frozen=True)
class WireLayout:
    """The layout an activation had on the sending stage.

    Attributes:
        placements: one per dimension of the sender's mesh.
        mesh_shape: the sender's mesh shape.
        global_shape: the DTensor's global shape (local pieces only; None: the wire is the global value).
        sender_mesh: the sender's DeviceMesh (global values only, in the one process that holds both).
        rank_offsets: the job ranks of the sender's mesh (row-major) minus the sending rank; None
            where one process holds every rank.
        mesh_dim_names: the sender's mesh dimension names (with `rank_offsets`).
    """

    placements: Tuple
    mesh_shape: Tuple[int, ...]
    global_shape: Optional[Tuple[int, ...]] = None
    sender_mesh: Optional[object] = None
    rank_offsets: Optional[Tuple[int, ...]] = None
    mesh_dim_names: Optional[Tuple[str, ...]] = None


def global_value(out: DTensor) -> Tensor:
    """`out`'s global value as a plain Tensor (differentiable; not accounted)."""
    mesh = out.device_mesh
    return out.redistribute(mesh, (Replicate(),) * len(out.placements), record=False).to_local()


def to_wire(out, stage_index: int, route: WireRoute):
    """`out` as the plain Tensor a stage sends (see module docstring); a plain Tensor as it is.

    Raises:
        ValueError: (local pieces) a layout too large for the header; (global values) a local
            output that differs per device.
    """
    if not isinstance(out, DTensor):
        return out
    if out.layout.is_rank_local:  # a style's use_local_output view of a sharded output: each device's own tensor
        return _rank_local_wire(out, stage_index, route)
    placements = tuple(out.placements)
    mesh = out.device_mesh
    mesh_shape = tuple(mesh.shape) if isinstance(mesh, DeviceMesh) else tuple(mesh.device_matrix)
    offsets = names = None
    if route.rank is not None:  # one rank here: its mesh's ranks are known (where one process holds all, not needed)
        ranks, names = _mesh_ranks(out)
        offsets = tuple(int(r) - route.rank for r in ranks.reshape(-1))
    if not route.local_pieces:
        wire = global_value(out)
        setattr(wire, _META, WireLayout(placements, mesh_shape, sender_mesh=out.device_mesh, rank_offsets=offsets,
                                        mesh_dim_names=names))
        return wire
    header = [len(mesh_shape), *mesh_shape, len(out.global_shape), *out.global_shape]
    for placement in placements:
        if isinstance(placement, Shard):
            header += [1, placement.dim % len(out.global_shape)]
        elif isinstance(placement, Partial):
            header += [2, REDUCE_OPS.index(placement.reduce_op)]
        else:
            header += [0, 0]
    header += _packed_offsets(offsets)
    for name in names:
        header += [len(name), *(ord(c) for c in name)]
    if len(header) > _MAX_HEADER:
        raise ValueError(f"PipelineStage {stage_index}: its DTensor output's layout (mesh {mesh_shape}, names "
                         f"{names}, shape {tuple(out.global_shape)}) needs "
                         f"{len(header)} header ints; at most {_MAX_HEADER} travel (shorter mesh dimension names, "
                         f"or a mesh of consecutive ranks, take fewer)")
    local = out.to_local()
    return attach_header(ops.reshape(local, local.shape), header)  # a new Tensor: the shard itself stays unmarked


def _mesh_ranks(out: DTensor):
    """The job ranks of `out`'s mesh (an array of its shape) and its dimension names."""
    mesh = out.device_mesh
    if isinstance(mesh, DeviceMesh):
        return np.asarray(mesh.mesh), tuple(mesh.mesh_dim_names)
    job = job_ranks_of(out.execution)  # a result of ops: its layout's mesh, the root
    return np.array([job[r] for r in mesh.rank_list]).reshape(mesh.device_matrix), tuple(mesh.alias_names)


def _packed_offsets(offsets) -> list:
    """The header's form of the mesh's rank offsets: [0, first] for consecutive ranks, else [1, *offsets]."""
    if offsets is None:
        raise ValueError("a DTensor's local piece travels only where this process is one rank (its rank unknown)")
    if list(offsets) == list(range(offsets[0], offsets[0] + len(offsets))):
        return [0, offsets[0]]
    return [1, *offsets]


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
    at = 2 + k + n
    placements = tuple(_placement(header[at + 2 * i], header[at + 2 * i + 1]) for i in range(k))
    at += 2 * k
    size = int(np.prod(mesh_shape))
    if header[at] == 0:
        offsets, at = tuple(range(header[at + 1], header[at + 1] + size)), at + 2
    else:
        offsets, at = tuple(header[at + 1:at + 1 + size]), at + 1 + size
    names = []
    for _ in range(k):
        length = header[at]
        names.append("".join(chr(c) for c in header[at + 1:at + 1 + length]))
        at += 1 + length
    return WireLayout(placements, mesh_shape, global_shape, rank_offsets=offsets, mesh_dim_names=tuple(names))


def _placement(code: int, arg: int):
    if code == 1:
        return Shard(arg)
    if code == 2:
        return Partial(REDUCE_OPS[arg])
    return Replicate()


def stage_mesh(cell) -> Optional[object]:
    """The mesh of the stage Cell's first laid-out Parameter, or None."""
    for param in cell.trainable_params():
        mesh = mesh_of(param)
        if mesh is not None:
            return mesh
    return None


def from_wire(x: Tensor, meta: WireLayout, mesh, stage_index: int, rank: Optional[int] = None) -> DTensor:
    """The DTensor a received Tensor stands for, on the receiving stage's `mesh` with the
    sender's placements: a global value laid out there, or this rank's local piece made a DTensor
    of the sender's global shape. `mesh` None (the stage has no laid-out Parameter): the sender's
    mesh moved to the block of `rank` (this process's or thread's job rank), or the sender's mesh
    itself where one process holds every rank (`rank` None).

    Raises:
        ValueError: the receiving mesh does not match the sender's (named).
    """
    placements = meta.placements
    if mesh is None:
        mesh = meta.sender_mesh if rank is None or meta.rank_offsets is None else received_mesh(meta, rank)
    if meta.global_shape is None:
        if mesh.ndim != len(placements):
            raise ValueError(f"PipelineStage {stage_index}: it receives a DTensor with placements {placements} (one "
                             f"per dimension of the sending stage's mesh), but its own mesh {mesh!r} has {mesh.ndim} "
                             f"dimensions; build every stage's mesh with the same shape")
        return distribute_tensor(x, mesh, placements, src_data_rank=None)
    if tuple(mesh.shape) != meta.mesh_shape:
        raise ValueError(f"PipelineStage {stage_index}: it receives a DTensor laid out on a mesh of shape "
                         f"{meta.mesh_shape} (placements {placements}), but its own mesh {mesh!r} has shape "
                         f"{tuple(mesh.shape)}; build every stage's mesh with the same shape")
    return DTensor.from_local(x, mesh, placements, shape=meta.global_shape)


def received_mesh(meta: WireLayout, rank: int) -> DeviceMesh:
    """The sender's mesh moved to the receiving `rank`'s block: its shape and dimension names over
    the sender's ranks plus `rank` minus the sending rank (upstream's receiving stage rebuilds the
    sender's layout over its own block's ranks the same way)."""
    ranks = np.array([rank + d for d in meta.rank_offsets]).reshape(meta.mesh_shape)
    return DeviceMesh("cpu", ranks, mesh_dim_names=meta.mesh_dim_names)
