"""`DeviceMesh.from_group`: a mesh over process groups a script already has (upstream's and torch's).

This package runs a mesh's collectives over the groups its own ranks define, so a group passed
in must be one of the mesh's groups along its dimension (through the calling rank where that is
known: under msrun and in a per-rank simulation); anything else is refused rather than giving a
mesh whose collectives would use other devices than the groups named.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mindspore_hyper.hyper_parallel.process_group import get_process_group_ranks
from mindspore_hyper.hyper_parallel.rank_threads import thread_rank
from mindspore_hyper.hyper_parallel.session import calling_rank, holds_all_ranks

__all__ = ["mesh_from_group"]


def mesh_from_group(mesh_class, group, device_type: str, mesh=None, mesh_dim_names: Optional[Sequence[str]] = None):
    """A mesh over existing process groups.

    One group: the 1-D mesh of its ranks. A list of groups: `mesh` gives the ranks, and group i
    is the group along dimension i.

    Args:
        mesh_class: the DeviceMesh class (passed in: this module sits below it).
        group: a `ProcessGroup` or group name (`get_group`, `split_group`,
            `get_platform().create_group`), or a list of them, one per mesh dimension.
        device_type: see `DeviceMesh`.
        mesh: the ranks (array-like, a Tensor, or a tuple of rows); optional for one group (then
            equal to its ranks), required for a list.
        mesh_dim_names: one name per dimension.

    Returns:
        The DeviceMesh (with its process groups: `get_group` answers).

    Raises:
        ValueError: an empty list, no `mesh` for a list, a mesh whose dimensions or ranks do not
            match the groups, or a group that is not the mesh's group along its dimension (named).
    """
    if not isinstance(group, (list, tuple)):
        ranks = get_process_group_ranks(group)
        if mesh is not None and [int(r) for r in np.asarray(_plain(mesh)).reshape(-1)] != ranks:
            raise ValueError(f"DeviceMesh.from_group: mesh={_plain(mesh)!r} differs from the group's ranks "
                             f"{ranks}; leave mesh out or pass the group's ranks")
        return mesh_class(device_type, ranks, mesh_dim_names=mesh_dim_names)
    groups = list(group)
    if not groups:
        raise ValueError("DeviceMesh.from_group: expected at least one group, got an empty list")
    if mesh is None:
        raise ValueError(f"DeviceMesh.from_group: mesh is required with a list of {len(groups)} groups "
                         "(the ranks, one dimension per group)")
    ranks = np.asarray(_plain(mesh))
    if ranks.ndim != len(groups):
        raise ValueError(f"DeviceMesh.from_group: mesh of shape {ranks.shape} has {ranks.ndim} dimensions; "
                         f"expected one per group ({len(groups)})")
    made = mesh_class(device_type, ranks, mesh_dim_names=mesh_dim_names)
    rank = thread_rank() if holds_all_ranks() else calling_rank("DeviceMesh.from_group")
    for dim, dim_group in enumerate(groups):
        given = tuple(get_process_group_ranks(dim_group))
        along = {tuple(sorted(made.members[r] for r in made.root.axis_group(local, [dim])))
                 for local in range(len(made.members))}
        if given not in along or (rank is not None and rank in made.members and rank not in given):
            through = f"rank {rank}" if rank is not None else "any rank"
            raise ValueError(f"DeviceMesh.from_group: group {dim} has ranks {list(given)}, which is not the group "
                             f"along mesh dimension {dim} ({made.mesh_dim_names[dim]!r}) through {through} of mesh "
                             f"{ranks.tolist()}: collectives here run over the mesh's groups; pass them in mesh "
                             "dimension order")
    return made


def _plain(mesh):
    """A mesh argument as numpy-convertible ranks (a Tensor's values; a tuple of rows stays a list)."""
    if hasattr(mesh, "asnumpy"):
        return mesh.asnumpy()
    if isinstance(mesh, (list, tuple)):
        return [_plain(row) for row in mesh]
    return mesh
