"""DeviceMesh: HyperParallel's (and torch's) named device mesh, over this package's Layout.

A DeviceMesh is a view of a root mesh (a `shard.Layout`): the root's dimensions it names, in
order. `mesh["tp"]` is the sub-mesh through the calling rank along "tp"; here it stays a view of
the root, so a DTensor placed on it is laid out on the root with Replicate on the dimensions the
view leaves out. That is what every rank sees in torch's semantics, and it needs no rank: the
simulation, which holds all ranks, runs the same script.

Questions whose answer is a rank (`get_rank`, `get_local_rank`, `get_coordinate`, a sub-mesh's
rank list) are answered under msrun and in a per-rank simulation (each thread is one rank), and
refused in the plain simulation, where they would differ per virtual device: a script that
branches on them cannot run once for all ranks.

A mesh may hold only some of the job's ranks (`members`, ascending; the root Layout numbers
them 0..n-1 by that order). Its DTensors live on those devices only: collectives among them,
the report counting them. A rank outside it gets `get_coordinate() is None`, as in torch; its
other rank questions and DTensors on the mesh are refused (torch gives it DTensors of empty
local tensors, which this package does not make). `init_device_mesh` with fewer devices than
the job follows upstream: rank r gets the mesh of ranks base..base+n-1, base = r - r % n, so the
job holds job/n copies of the mesh (`copies`), each rank inside its own. The plain simulation
runs copy 0 (ranks 0..n-1): the script runs once with the same values for every rank, so every
copy computes the same.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from mindspore_hyper.hyper_parallel.session import (
    RankDependentError, calling_rank, current_meshes, execution_for, holds_all_ranks, job_size,
)
from mindspore_hyper.hyper_parallel.mesh_from_group import mesh_from_group
from mindspore_hyper.hyper_parallel.mesh_reshape import flatten_mesh, unflatten_mesh
from mindspore_hyper.hyper_parallel.rank_threads import thread_rank
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.placement import Partial, Placement, Replicate, Shard
from mindspore_hyper.shard.tensor_layout import NONE_ALIAS, TensorLayout

__all__ = ["DeviceMesh", "init_device_mesh", "get_current_mesh", "RankDependentError"]

DEVICE_TYPES = ("cpu", "npu", "gpu", "cuda", "ascend")


class DeviceMesh:
    """A mesh of devices with named dimensions (see module docstring).

    Args:
        device_type: "npu", "cpu", "gpu" ("cuda", "ascend" accepted); every kind runs on this
            machine's CPU in simulation and under msrun.
        mesh: the job's ranks of its devices, an n-dimensional array-like of distinct ranks
            (all of the job's or some of them).
        mesh_dim_names: one unique name per dimension. Without them the dimensions are called
            "dim0", "dim1", ... in reports, and the mesh cannot be sliced (`mesh["dp"]`).
        _init_backend: False: no process groups (`init_device_mesh(init_backend=False)`).

    Raises:
        ValueError: an unknown device type, repeated or negative ranks, or names that do not
            match the dimensions (upstream's messages).
    """

    def __init__(self, device_type: str, mesh, *, mesh_dim_names: Optional[Sequence[str]] = None,
                 _init_backend: bool = True):
        if not isinstance(device_type, str) or device_type.lower() not in DEVICE_TYPES:
            raise ValueError(f"DeviceMesh: device_type={device_type!r}; expected one of {DEVICE_TYPES}")
        ranks = np.asarray(mesh.asnumpy() if hasattr(mesh, "asnumpy") else mesh)
        if ranks.ndim == 0 or ranks.size == 0 or not np.issubdtype(ranks.dtype, np.integer):
            raise ValueError(f"DeviceMesh: mesh must be a non-empty integer array of ranks, got {mesh!r}")
        flat = [int(r) for r in ranks.reshape(-1)]
        if len(set(flat)) != len(flat) or min(flat) < 0:
            raise ValueError(f"DeviceMesh: mesh={flat}: expected distinct non-negative ranks (rank_list)")
        named = mesh_dim_names is not None
        mesh_dim_names = _checked_names(mesh_dim_names, ranks.shape) if named else tuple(
            f"dim{i}" for i in range(ranks.ndim))
        members = tuple(sorted(flat))
        root = Layout(tuple(int(n) for n in ranks.shape), tuple(mesh_dim_names),
                      rank_list=[members.index(r) for r in flat])
        self._init(device_type.lower(), root, tuple(range(root.ndim)), members, 1,
                   MeshFamily(root, named, _init_backend))

    def view(self, dims: Tuple[int, ...]) -> "DeviceMesh":
        """The mesh along the root's dimensions `dims` (indices into `root`), on the same devices."""
        view = DeviceMesh.__new__(DeviceMesh)
        view._init(self.device_type, self.root, tuple(dims), self.members, self.copies, self.family)
        return view

    def _init(self, device_type: str, root: Layout, dims: Tuple[int, ...], members: Tuple[int, ...],
              copies: int, family: "MeshFamily") -> None:
        self.device_type = device_type
        self.root = root
        self.dims = dims
        self.members = members  # the job's rank of each root rank (root rank i = job rank members[i])
        self.copies = copies  # how many copies of the mesh the job holds (init_device_mesh, upstream's tiling)
        self.family = family  # torch's root mesh: its dimension names and the meshes _flatten registered

    # -- shape -------------------------------------------------------------------------------
    @property
    def mesh_dim_names(self) -> Tuple[str, ...]:
        return tuple(self.root.alias_names[d] for d in self.dims)

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.root.device_matrix[d] for d in self.dims)

    def size(self, mesh_dim: Union[int, str, None] = None) -> int:
        """Devices in the mesh, or along one dimension (index or name)."""
        if mesh_dim is None:
            return math.prod(self.shape)
        return self.shape[self._dim_index(mesh_dim)]

    @property
    def mesh_shape(self) -> Tuple[int, ...]:
        """Upstream's name for `shape`."""
        return self.shape

    @property
    def rank_list(self) -> Tuple[int, ...]:
        """The job's ranks of this mesh, row-major (upstream's; a sub-mesh's depend on the calling rank)."""
        return tuple(int(r) for r in self.mesh.reshape(-1))

    @property
    def root_mesh(self) -> Optional["DeviceMesh"]:
        """The mesh this one was sliced, flattened or unflattened from (upstream's `root_mesh`); None
        for that mesh itself."""
        if self.is_family_root():
            return None
        root = DeviceMesh.__new__(DeviceMesh)
        root._init(self.device_type, self.family.root, tuple(range(self.family.root.ndim)), self.members,
                   self.copies, self.family)
        return root

    @property
    def mesh(self) -> np.ndarray:
        """The job's ranks of this mesh as an array (a sub-mesh's, and a mesh of several copies',
        depend on the calling rank)."""
        if self.dims == tuple(range(self.root.ndim)) and self.copies == 1:
            return np.array([self.members[r] for r in self.root.rank_list]).reshape(self.root.device_matrix)
        what = "the ranks of sub-mesh" if self.copies == 1 else f"the ranks of a mesh tiling the job {self.copies} times"
        local = self._local_rank(f"{what} {self.mesh_dim_names}")
        if self.dims == tuple(range(self.root.ndim)):
            ranks = list(self.root.rank_list)
        else:
            ranks = self.root.axis_group(local, list(self.dims))
        return np.array([self.members[r] for r in ranks]).reshape(self.shape)

    def _dim_index(self, mesh_dim: Union[int, str]) -> int:
        if isinstance(mesh_dim, str):
            if mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh dimension {mesh_dim!r} not in {self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        if not isinstance(mesh_dim, int) or not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh_dim={mesh_dim!r}: the mesh has {self.ndim} dimensions {self.mesh_dim_names}")
        return mesh_dim % self.ndim

    def __getitem__(self, names: Union[str, Sequence[str]]) -> "DeviceMesh":
        """The sub-mesh along the named dimension(s), e.g. `mesh["tp"]`, `mesh["dp", "tp"]`.

        Raises:
            RuntimeError: the mesh was made without mesh_dim_names (upstream's and torch's rule).
            KeyError: an unknown or repeated name.
        """
        if not self.family.named:
            raise RuntimeError(f"Cannot slice a DeviceMesh without mesh_dim_names! ({self!r} was made without "
                               "mesh_dim_names: pass mesh_dim_names=... to init_device_mesh or DeviceMesh)")
        names = (names,) if isinstance(names, str) else tuple(names)
        if len(names) == 1 and names[0] not in self.mesh_dim_names and names[0] in self.family.flattened:
            if not self.is_family_root():
                raise KeyError(f"DeviceMesh[{names[0]!r}]: a flattened dimension is sliced from the mesh it was "
                               f"flattened from the root of (torch's rule), not from this view {self.mesh_dim_names}; "
                               f"keep the mesh _flatten returned")
            return self.family.flattened[names[0]]
        if not names or len(set(names)) != len(names):
            raise KeyError(f"DeviceMesh[{names!r}]: name one or more distinct dimensions of {self.mesh_dim_names}")
        dims = []
        for name in names:
            if name not in self.mesh_dim_names:
                raise KeyError(f"DeviceMesh[{name!r}]: no such dimension; this mesh has {self.mesh_dim_names}")
            dims.append(self.dims[self.mesh_dim_names.index(name)])
        return self.view(tuple(dims))

    # -- torch's private reshaping (MindFormers' ParallelDims.build_mesh calls both) -----------
    def is_family_root(self) -> bool:
        """Whether this is the mesh every `_flatten`/`_unflatten`/slice here came from (torch's root)."""
        return self.root is self.family.root and self.dims == tuple(range(self.root.ndim))

    def _root_ranks(self) -> np.ndarray:
        """The job's ranks of the root mesh, shaped as the root."""
        return np.array([self.members[r] for r in self.root.rank_list]).reshape(self.root.device_matrix)

    def _reshaped(self, reshaped) -> "DeviceMesh":
        """A view of a new root over the same devices: (job ranks, names, view dims) (`mesh_reshape`)."""
        ranks, names, dims = reshaped
        root = DeviceMesh(self.device_type, ranks, mesh_dim_names=names).root
        mesh = DeviceMesh.__new__(DeviceMesh)
        mesh._init(self.device_type, root, dims, self.members, self.copies, self.family)
        return mesh

    def _unflatten(self, dim: Union[int, str], mesh_sizes: Sequence[int], mesh_dim_names: Sequence[str],
                   backend_override: Optional[dict] = None) -> "DeviceMesh":
        """torch's `DeviceMesh._unflatten`: see `mesh_reshape.unflatten_mesh`."""
        return unflatten_mesh(self, dim, mesh_sizes, mesh_dim_names, backend_override)

    def _flatten(self, mesh_dim_name: Optional[str] = None, backend_override=None) -> "DeviceMesh":
        """torch's `DeviceMesh._flatten`: see `mesh_reshape.flatten_mesh`."""
        return flatten_mesh(self, mesh_dim_name, backend_override)

    # -- the calling process -----------------------------------------------------------------
    def _local_rank(self, what: str) -> int:
        """The calling rank's root rank.

        Raises:
            RankDependentError: in the plain simulation.
            ValueError: the calling rank is not in this mesh.
        """
        rank = calling_rank(what)
        if rank not in self.members:
            raise ValueError(f"{what}: rank {rank} is not in this mesh (its ranks: {list(self.members)})")
        return self.members.index(rank)

    def get_rank(self) -> int:
        """This process's global rank (msrun, per-rank simulation; refused in the plain simulation)."""
        return calling_rank("get_rank()")

    def get_coordinate(self) -> Optional[List[int]]:
        """This process's coordinate on each dimension of the mesh; None for a rank outside it (torch)."""
        rank = calling_rank("get_coordinate()")
        if rank not in self.members:
            return None
        coords = self.root.coords(self.members.index(rank))
        return [coords[d] for d in self.dims]

    def get_local_rank(self, mesh_dim: Union[int, str, None] = None) -> int:
        """This process's index along `mesh_dim` (required for a mesh of several dimensions)."""
        if mesh_dim is None and self.ndim != 1:
            raise ValueError(f"get_local_rank: name mesh_dim for a {self.ndim}-dimensional mesh {self.mesh_dim_names}")
        coords = self.root.coords(self._local_rank("get_local_rank()"))
        return [coords[d] for d in self.dims][self._dim_index(mesh_dim or 0)]

    def get_group(self, mesh_dim: Union[int, str, None] = None):
        """The process group along `mesh_dim` through this process (`ProcessGroup`)."""
        from mindspore_hyper.hyper_parallel.process_group import ProcessGroup

        if not self.family.init_backend:
            raise RuntimeError(f"DeviceMesh.get_group: process groups not initialized ({self!r} was made with "
                               "init_backend=False); make the mesh with init_backend=True (the default)")
        if isinstance(mesh_dim, str) and mesh_dim not in self.mesh_dim_names and mesh_dim in self.family.flattened:
            return self.family.flattened[mesh_dim].get_group()  # torch: the root's flattened dimensions
        if mesh_dim is None and self.ndim != 1:
            raise ValueError(f"get_group: name mesh_dim for a {self.ndim}-dimensional mesh {self.mesh_dim_names}")
        local = self._local_rank("get_group()")
        dim = self.dims[self._dim_index(mesh_dim or 0)]
        return ProcessGroup(tuple(self.members[r] for r in self.root.axis_group(local, [dim])))

    @staticmethod
    def from_group(group, device_type: str, mesh=None,
                   mesh_dim_names: Optional[Sequence[str]] = None) -> "DeviceMesh":
        """A mesh over existing process groups (upstream's and torch's `DeviceMesh.from_group`):
        see `mesh_from_group.mesh_from_group`, which documents the arguments and refusals."""
        return mesh_from_group(DeviceMesh, group, device_type, mesh, mesh_dim_names)

    # -- layouts -----------------------------------------------------------------------------
    def tensor_layout(self, placements, ndim: int, base: Optional[TensorLayout] = None) -> TensorLayout:
        """The TensorLayout on the root mesh of `placements` on this mesh: one Placement per
        dimension of this mesh, or HyperParallel's alias form (one mesh-dimension name, "None" or
        a tuple of names per tensor dimension). The root's dimensions this mesh leaves out keep
        `base`'s placements (a DTensor redistributed on a sub-mesh), else Replicate.

        Raises:
            ValueError: a wrong number of placements, an unknown placement or name.
        """
        placements = tuple(placements)
        if placements and all(_is_alias(p) for p in placements):
            if len(placements) != ndim:
                raise ValueError(f"alias placements {placements}: expected one entry per tensor dimension ({ndim})")
            for entry in placements:
                for name in (entry,) if isinstance(entry, str) else entry:
                    if name != NONE_ALIAS and name not in self.mesh_dim_names:
                        raise ValueError(f"alias placements {placements}: {name!r} is not a dimension of this mesh "
                                         f"{self.mesh_dim_names}")
            return TensorLayout(self.root, placements)
        if len(placements) != self.ndim:
            raise ValueError(f"placements {placements}: expected one per mesh dimension {self.mesh_dim_names} "
                             f"({self.ndim}), got {len(placements)}")
        full: List[Placement] = [Replicate()] * self.root.ndim
        if base is not None and base.mesh == self.root and not base.is_rank_local:
            full = list(base.placements)  # the dims this view leaves out keep their placements
        for dim, placement in zip(self.dims, placements):
            if not isinstance(placement, (Shard, Replicate, Partial)):
                raise ValueError(f"placements {placements}: {placement!r} is not Shard, Replicate or Partial "
                                 "(StridedShard is not supported yet)")
            full[dim] = placement
        return TensorLayout.from_placements(self.root, full, ndim)

    def holds(self, layout: TensorLayout) -> bool:
        """Whether `layout` varies only along this mesh's dimensions."""
        used = set(layout.sharded_axes()) | set(layout.partial)
        return layout.mesh == self.root and used <= set(self.dims)

    def placements_of(self, layout: TensorLayout) -> Tuple[Placement, ...]:
        """`layout`'s placements on this mesh's dimensions."""
        placements = layout.placements
        return tuple(placements[d] for d in self.dims)

    def execution(self):
        """The run that DTensors on this mesh belong to (simulation or msrun, by the context)."""
        return execution_for(self.root, self.members)

    # -- identity ----------------------------------------------------------------------------
    def __enter__(self) -> "DeviceMesh":
        current_meshes().append(self)
        return self

    def __exit__(self, *exc) -> None:
        current_meshes().pop()

    def __eq__(self, other) -> bool:
        return (isinstance(other, DeviceMesh) and self.root == other.root and self.dims == other.dims
                and self.members == other.members)

    def __hash__(self) -> int:
        return hash((self.root, self.dims, self.members))

    def __repr__(self) -> str:
        ranks = "" if self.members == tuple(range(len(self.members))) else f", ranks={list(self.members)}"
        return f"DeviceMesh({self.device_type!r}, shape={self.shape}, mesh_dim_names={self.mesh_dim_names}{ranks})"


class MeshFamily:
    """What the meshes derived from one constructed mesh share (torch's root mesh): that mesh's
    Layout, the meshes `_flatten` made from any of them, by name, whether its dimensions were
    named (`named`: an unnamed mesh cannot be sliced) and whether it has process groups
    (`init_backend`: `get_group` is refused without)."""

    def __init__(self, root: Layout, named: bool = True, init_backend: bool = True):
        self.root = root
        self.root_names = root.alias_names
        self.named = named
        self.init_backend = init_backend
        self.flattened: Dict[str, DeviceMesh] = {}


INTERLEAVED = "interleaved_parallel"


def _checked_names(mesh_dim_names: Sequence[str], shape: Tuple[int, ...]) -> Tuple[str, ...]:
    """`mesh_dim_names` checked as upstream checks them (its messages), as a tuple.

    Raises:
        ValueError: not one distinct name per dimension; upstream's virtual dimension
            "interleaved_parallel" anywhere (not last: upstream's error; last: not supported here).
    """
    names = tuple(mesh_dim_names)
    if len(names) != len(shape):
        raise ValueError(f"DeviceMesh: mesh dimensions ({len(shape)}, shape {tuple(shape)}) should be equal to "
                         f"mesh_dim_names length ({len(names)}): mesh_dim_names={names}")
    if len(set(names)) != len(names):
        raise ValueError(f"DeviceMesh: Each element of mesh_dim_names {names} should be different")
    if INTERLEAVED in names and names.index(INTERLEAVED) != len(names) - 1:
        raise ValueError(f"DeviceMesh: mesh_dim_names={names}: 'interleaved_parallel' should be at the last dim of "
                         "mesh_dim_names, means virtual sharding.")
    if INTERLEAVED in names:
        raise ValueError(f"DeviceMesh: mesh_dim_names={names}: the virtual dimension 'interleaved_parallel' "
                         "(upstream's interleaved sharding) is not supported; name a real mesh dimension")
    return names


def _is_alias(entry) -> bool:
    return isinstance(entry, str) or (isinstance(entry, tuple) and bool(entry) and all(isinstance(x, str) for x in entry))


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *,
                     mesh_dim_names: Optional[Sequence[str]] = None,
                     rank_list: Optional[Sequence[int]] = None, init_backend: bool = True) -> DeviceMesh:
    """A mesh of `mesh_shape` (row-major over its ranks), made the current mesh.

    Its ranks, as upstream's: `rank_list` when given; else, for n = prod(mesh_shape) devices in a
    job of N, ranks base..base+n-1 with base = r - r % n for the calling rank r (all of the job
    when n = N; N/n copies of the mesh otherwise, each rank inside its own; see module docstring).

    Args:
        device_type: see `DeviceMesh`.
        mesh_shape: positive ints; their product is at most the job's device count.
        mesh_dim_names: one name per dimension.
        rank_list: the job's ranks of the mesh, row-major (prod(mesh_shape) distinct ranks).
        init_backend: False: the mesh has no process groups (upstream's flag): `get_group` is
            refused; its DTensors' collectives still run (this package makes a group when a
            collective needs it).

    Raises:
        ValueError: a bad shape or rank_list, more devices than the job has, or (without
            rank_list) a mesh size that does not divide the job's device count.
    """
    shape = tuple(mesh_shape)
    if not shape or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
        raise ValueError(f"init_device_mesh: mesh_shape={mesh_shape!r}; expected positive ints")
    size, job = math.prod(shape), job_size()
    if size > job:
        raise ValueError(f"init_device_mesh(mesh_shape={shape}): {size} devices, but the job has {job}; "
                         f"a mesh holds at most the job's devices")
    copies = 1
    if rank_list is not None:
        ranks = list(rank_list)
        if len(ranks) != size:
            raise ValueError(f"init_device_mesh: rank_list has {len(ranks)} ranks; expected prod(mesh_shape)={size}")
    elif size == job:
        ranks = list(range(size))
    else:
        if job % size:
            raise ValueError(f"init_device_mesh(mesh_shape={shape}): {size} devices do not divide the job's {job}; "
                             f"without rank_list upstream gives rank r the ranks base..base+{size - 1} (base = r - r % "
                             f"{size}), which needs a multiple: pass rank_list=... or change the mesh")
        copies = job // size
        rank = 0 if holds_all_ranks() and thread_rank() is None else calling_rank("init_device_mesh")
        base = rank - rank % size
        ranks = list(range(base, base + size))
    if not isinstance(init_backend, bool):
        raise ValueError(f"init_device_mesh: init_backend={init_backend!r}; expected a bool")
    mesh = DeviceMesh(device_type, np.array(ranks).reshape(shape), mesh_dim_names=mesh_dim_names,
                      _init_backend=init_backend)
    mesh.copies = copies
    current_meshes()[:] = [mesh]
    return mesh


def get_current_mesh() -> DeviceMesh:
    """The innermost `with mesh:` block's mesh, else the last `init_device_mesh` result.

    Raises:
        RuntimeError: no mesh was made.
    """
    meshes = current_meshes()
    if not meshes:
        raise RuntimeError("get_current_mesh: no device mesh yet; call init_device_mesh(...) first")
    return meshes[-1]
