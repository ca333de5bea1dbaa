"""The arithmetic of torch's private `DeviceMesh._unflatten` / `_flatten` on a root mesh's rank
array (`device_mesh.py` builds the meshes): which job ranks, dimension names and view dimensions
the reshaped mesh has; `unflatten_mesh` and `flatten_mesh` make the DeviceMesh from them.

A DeviceMesh here is a view (`dims`) of a root's rank array. Unflattening view dimension `dim`
splits its root dimension row-major into `sizes` (a reshape of the rank array). Flattening moves
the view's root dimensions, in the view's order, after the root's other dimensions and merges them
(a transpose and a reshape): the first view dimension varies slowest, as torch's `_flatten`.
The root's other dimensions stay, so a reshaped sub-mesh is still a sub-mesh through the calling
rank, as in torch.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["unflattened", "flattened", "check_unique", "unflatten_mesh", "flatten_mesh"]

Reshaped = Tuple[np.ndarray, Tuple[str, ...], Tuple[int, ...]]  # root ranks, root names, view dims


def unflattened(ranks: np.ndarray, root_names: Sequence[str], dims: Tuple[int, ...], dim: Union[int, str],
                mesh_sizes: Sequence[int], mesh_dim_names: Sequence[str], backend_override: Optional[dict],
                what: str) -> Reshaped:
    """The root and view after splitting view dimension `dim` into `mesh_sizes` named `mesh_dim_names`.

    Raises:
        ValueError: an unknown dim, sizes whose product is not the dimension's size, a name count
            that differs from the sizes', or an unknown backend_override key.
    """
    names = tuple(root_names[d] for d in dims)
    if isinstance(dim, str):
        if dim not in names:
            raise ValueError(f"{what}: dim {dim!r} is not in {names}")
        dim = names.index(dim)
    if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim < len(dims):
        raise ValueError(f"{what}: dim must be a dimension index in [0, {len(dims)}) or a name of {names}")
    sizes, new_names = tuple(mesh_sizes), tuple(mesh_dim_names)
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"{what}: mesh_sizes must be positive ints")
    split = dims[dim]
    if math.prod(sizes) != ranks.shape[split]:
        raise ValueError(f"{what}: the product of mesh_sizes is {math.prod(sizes)}, but dimension {dim} "
                         f"({names[dim]!r}) has size {ranks.shape[split]}; they must be equal")
    if len(new_names) != len(sizes) or not all(isinstance(n, str) and n for n in new_names):
        raise ValueError(f"{what}: mesh_dim_names must be one non-empty string per mesh size ({len(sizes)})")
    for key in (backend_override or {}):
        if key not in new_names and not (isinstance(key, int) and 0 <= key < len(new_names)):
            raise ValueError(f"{what}: backend_override key {key!r} is not one of the new dimensions {new_names} "
                             f"or their indices")
    shape, out_names = list(ranks.shape), list(root_names)
    shape[split:split + 1], out_names[split:split + 1] = sizes, new_names
    view: List[int] = []
    for d in dims:
        if d == split:
            view += range(split, split + len(sizes))
        else:
            view.append(d if d < split else d + len(sizes) - 1)
    return ranks.reshape(shape), check_unique(out_names, root_names, what), tuple(view)


def flattened(ranks: np.ndarray, root_names: Sequence[str], dims: Tuple[int, ...], name: str, what: str) -> Reshaped:
    """The root and (1-D) view after merging the view's dimensions into one named `name`."""
    others = [d for d in range(ranks.ndim) if d not in dims]
    shape = [ranks.shape[d] for d in others] + [math.prod(ranks.shape[d] for d in dims)]
    names = [root_names[d] for d in others] + [name]
    return (ranks.transpose(others + list(dims)).reshape(shape), check_unique(names, root_names, what),
            (len(others),))


def check_unique(names: Sequence[str], root_names: Sequence[str], what: str) -> Tuple[str, ...]:
    """`names` as a tuple.

    Raises:
        ValueError: a name repeats.
    """
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise ValueError(f"{what}: dimension name(s) {repeated} would repeat in the mesh {tuple(names)} "
                         f"(this mesh is a view of {tuple(root_names)}); choose other names")
    return tuple(names)


def unflatten_mesh(mesh, dim: Union[int, str], mesh_sizes: Sequence[int], mesh_dim_names: Sequence[str],
                   backend_override: Optional[dict] = None):
    """`mesh` (a DeviceMesh) with dimension `dim` split row-major into `mesh_sizes` named
    `mesh_dim_names` (torch's `DeviceMesh._unflatten`): (8,) unflattened to (2, 2, 2) is
    [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]; a sub-mesh stays a sub-mesh through the calling rank.

    Args:
        mesh: the DeviceMesh.
        dim: the dimension to split, index or name.
        mesh_sizes: positive ints whose product is that dimension's size.
        mesh_dim_names: one new name per size.
        backend_override: torch's per-dimension process-group backend ({name or index:
            backend}, "fake" for none): its keys are checked; no effect here, where a
            dimension's group is made when a collective needs it, on this package's transport.

    Returns:
        The unflattened mesh (same devices; DTensors on it are laid out on its own root).

    Raises:
        ValueError: an unknown dim, sizes whose product is not the dimension's size, a name
            count that differs from the sizes', a repeated name or an unknown override key.
    """
    what = (f"DeviceMesh._unflatten(dim={dim!r}, mesh_sizes={tuple(mesh_sizes)}, "
            f"mesh_dim_names={tuple(mesh_dim_names)})")
    return mesh._reshaped(unflattened(mesh._root_ranks(), mesh.root.alias_names, mesh.dims, dim, mesh_sizes,
                                      mesh_dim_names, backend_override, what))


def flatten_mesh(mesh, mesh_dim_name: Optional[str] = None, backend_override=None):
    """`mesh`'s (a DeviceMesh's) dimensions as one (torch's `DeviceMesh._flatten`) named
    `mesh_dim_name` (default: the names joined by "_"), the first varying slowest: (2, 2, 2)
    ("dp", "cp", "tp") flattened along ["dp", "tp"] is [0, 1, 4, 5] through rank 0. It is
    registered with the family root, whose `root[name]` and `get_group(name)` then find it.

    Args:
        mesh: the DeviceMesh.
        mesh_dim_name: the flattened dimension's name.
        backend_override: torch's process-group backend for it; no effect (see `unflatten_mesh`).

    Returns:
        The 1-D mesh (`mesh` itself when it is 1-D and already has that name).

    Raises:
        ValueError: the name is one of the root's names, or an earlier `_flatten` gave the
            same name to other devices.
    """
    name = mesh_dim_name or "_".join(mesh.mesh_dim_names)
    if mesh.ndim == 1 and name in mesh.mesh_dim_names:
        return mesh
    what = f"DeviceMesh._flatten({name!r}) of {mesh.mesh_dim_names}"
    if not isinstance(name, str) or name in mesh.family.root_names:
        raise ValueError(f"{what}: expected a string that is not already a dimension of the root mesh "
                         f"{mesh.family.root_names}; choose another name")
    flat = mesh._reshaped(flattened(mesh._root_ranks(), mesh.root.alias_names, mesh.dims, name, what))
    earlier = mesh.family.flattened.setdefault(name, flat)
    if earlier != flat:
        raise ValueError(f"{what}: a flattened mesh named {name!r} was made before on other devices "
                         f"({earlier}); choose another name")
    return earlier
