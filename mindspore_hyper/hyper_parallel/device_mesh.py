"""DeviceMesh: HyperParallel's (and torch's) named device mesh, over this package's Layout.

A DeviceMesh is a view of a root mesh (a `shard.Layout`): the root's dimensions it names, in
order. `mesh["tp"]` is the sub-mesh through the calling rank along "tp"; here it stays a view of
the root, so a DTensor placed on it is laid out on the root with Replicate on the dimensions the
view leaves out. That is what every rank sees in torch's semantics, and it needs no rank: the
simulation, which holds all ranks, runs the same script.

Questions whose answer is a rank (`get_rank`, `get_local_rank`, `get_coordinate`, a sub-mesh's
rank list) are answered under msrun and refused in simulation, where they would differ per
virtual device: a script that branches on them cannot run once for all ranks.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from mindspore_hyper.hyper_parallel.session import (
    RankDependentError, check_device_count, current_meshes, execution_for, refuse_in_simulation,
)
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.placement import Partial, Placement, Replicate, Shard
from mindspore_hyper.shard.tensor_layout import NONE_ALIAS, TensorLayout

__all__ = ["DeviceMesh", "init_device_mesh", "get_current_mesh", "RankDependentError"]

DEVICE_TYPES = ("cpu", "npu", "gpu", "cuda", "ascend")


def _process_rank() -> int:
    from mindspore_hyper.runtime.distributed.world import world

    return world().rank


class DeviceMesh:
    """A mesh of devices with named dimensions (see module docstring).

    Args:
        device_type: "npu", "cpu", "gpu" ("cuda", "ascend" accepted); every kind runs on this
            machine's CPU in simulation and under msrun.
        mesh: the global ranks, an n-dimensional array-like; a permutation of range(size).
        mesh_dim_names: one unique name per dimension (default "dim0", "dim1", ...).

    Raises:
        ValueError: an unknown device type, a mesh that is not a permutation of its ranks, or
            names that do not match the dimensions.
    """

    def __init__(self, device_type: str, mesh, *, mesh_dim_names: Optional[Sequence[str]] = None):
        if not isinstance(device_type, str) or device_type.lower() not in DEVICE_TYPES:
            raise ValueError(f"DeviceMesh: device_type={device_type!r}; expected one of {DEVICE_TYPES}")
        ranks = np.asarray(mesh.asnumpy() if hasattr(mesh, "asnumpy") else mesh)
        if ranks.ndim == 0 or ranks.size == 0 or not np.issubdtype(ranks.dtype, np.integer):
            raise ValueError(f"DeviceMesh: mesh must be a non-empty integer array of ranks, got {mesh!r}")
        if mesh_dim_names is None:
            mesh_dim_names = tuple(f"dim{i}" for i in range(ranks.ndim))
        if len(tuple(mesh_dim_names)) != ranks.ndim:
            raise ValueError(f"DeviceMesh: mesh_dim_names={tuple(mesh_dim_names)} has {len(tuple(mesh_dim_names))} "
                             f"names for a {ranks.ndim}-dimensional mesh of shape {ranks.shape}")
        root = Layout(tuple(int(n) for n in ranks.shape), tuple(mesh_dim_names),
                      rank_list=[int(r) for r in ranks.reshape(-1)])
        self._init(device_type.lower(), root, tuple(range(root.ndim)))

    @classmethod
    def _view(cls, device_type: str, root: Layout, dims: Tuple[int, ...]) -> "DeviceMesh":
        view = cls.__new__(cls)
        view._init(device_type, root, dims)
        return view

    def _init(self, device_type: str, root: Layout, dims: Tuple[int, ...]) -> None:
        self.device_type = device_type
        self.root = root
        self.dims = dims

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
    def mesh(self) -> np.ndarray:
        """The ranks of this mesh as an array (a sub-mesh's depend on the calling rank)."""
        if self.dims == tuple(range(self.root.ndim)):
            return np.array(self.root.rank_list).reshape(self.root.device_matrix)
        refuse_in_simulation(f"the ranks of sub-mesh {self.mesh_dim_names}")
        ranks = self.root.axis_group(_process_rank(), list(self.dims))
        return np.array(ranks).reshape(self.shape)

    def _dim_index(self, mesh_dim: Union[int, str]) -> int:
        if isinstance(mesh_dim, str):
            if mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh dimension {mesh_dim!r} not in {self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        if not isinstance(mesh_dim, int) or not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh_dim={mesh_dim!r}: the mesh has {self.ndim} dimensions {self.mesh_dim_names}")
        return mesh_dim % self.ndim

    def __getitem__(self, names: Union[str, Sequence[str]]) -> "DeviceMesh":
        """The sub-mesh along the named dimension(s), e.g. `mesh["tp"]`, `mesh["dp", "tp"]`."""
        names = (names,) if isinstance(names, str) else tuple(names)
        if not names or len(set(names)) != len(names):
            raise KeyError(f"DeviceMesh[{names!r}]: name one or more distinct dimensions of {self.mesh_dim_names}")
        dims = []
        for name in names:
            if name not in self.mesh_dim_names:
                raise KeyError(f"DeviceMesh[{name!r}]: no such dimension; this mesh has {self.mesh_dim_names}")
            dims.append(self.dims[self.mesh_dim_names.index(name)])
        return DeviceMesh._view(self.device_type, self.root, tuple(dims))

    # -- the calling process -----------------------------------------------------------------
    def get_rank(self) -> int:
        """This process's global rank (msrun only; refused in simulation)."""
        refuse_in_simulation("get_rank()")
        return _process_rank()

    def get_coordinate(self) -> List[int]:
        """This process's coordinate on each dimension of the mesh."""
        refuse_in_simulation("get_coordinate()")
        coords = self.root.coords(_process_rank())
        return [coords[d] for d in self.dims]

    def get_local_rank(self, mesh_dim: Union[int, str, None] = None) -> int:
        """This process's index along `mesh_dim` (required for a mesh of several dimensions)."""
        if mesh_dim is None and self.ndim != 1:
            raise ValueError(f"get_local_rank: name mesh_dim for a {self.ndim}-dimensional mesh {self.mesh_dim_names}")
        refuse_in_simulation("get_local_rank()")
        return self.get_coordinate()[self._dim_index(mesh_dim or 0)]

    def get_group(self, mesh_dim: Union[int, str, None] = None):
        """The process group along `mesh_dim` through this process (`ProcessGroup`)."""
        from mindspore_hyper.hyper_parallel.process_group import ProcessGroup

        if mesh_dim is None and self.ndim != 1:
            raise ValueError(f"get_group: name mesh_dim for a {self.ndim}-dimensional mesh {self.mesh_dim_names}")
        refuse_in_simulation("get_group()")
        dim = self.dims[self._dim_index(mesh_dim or 0)]
        return ProcessGroup(tuple(self.root.axis_group(_process_rank(), [dim])))

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
        return execution_for(self.root)

    # -- identity ----------------------------------------------------------------------------
    def __enter__(self) -> "DeviceMesh":
        current_meshes().append(self)
        return self

    def __exit__(self, *exc) -> None:
        current_meshes().pop()

    def __eq__(self, other) -> bool:
        return isinstance(other, DeviceMesh) and self.root == other.root and self.dims == other.dims

    def __hash__(self) -> int:
        return hash((self.root, self.dims))

    def __repr__(self) -> str:
        return f"DeviceMesh({self.device_type!r}, shape={self.shape}, mesh_dim_names={self.mesh_dim_names})"


def _is_alias(entry) -> bool:
    return isinstance(entry, str) or (isinstance(entry, tuple) and bool(entry) and all(isinstance(x, str) for x in entry))


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *,
                     mesh_dim_names: Optional[Sequence[str]] = None) -> DeviceMesh:
    """A mesh of `mesh_shape` over ranks 0..N-1 (row-major), made the current mesh.

    N must be the job's device count: `device_num` in simulation (`mindspore-hyper run
    --devices N` sets it), the msrun worker count under msrun.

    Raises:
        ValueError: a bad shape, or N differs from the job's device count (the message says how to match).
    """
    shape = tuple(mesh_shape)
    if not shape or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
        raise ValueError(f"init_device_mesh: mesh_shape={mesh_shape!r}; expected positive ints")
    check_device_count(math.prod(shape), f"init_device_mesh(mesh_shape={shape})")
    mesh = DeviceMesh(device_type, np.arange(math.prod(shape)).reshape(shape), mesh_dim_names=mesh_dim_names)
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
