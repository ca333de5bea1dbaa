"""HyperParallel's `hsdp` (hybrid sharded data parallel) over `fully_shard`'s machinery.

Each Parameter is split along dimension 0 over its data-parallel group: the dimensions of its
mesh that its layout leaves replicated (or, with `shard_size`, the innermost of them whose sizes
multiply to it: sharded within those, replicated across the rest). Gradients are summed over the
group and multiplied by `grad_scale`, as upstream's hsdp does; the values are the same at every
`optimizer_level`, and every level here splits parameters, gradients and optimizer states.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

from mindspore import nn

from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh, get_current_mesh
from mindspore_hyper.hyper_parallel.fully_shard import shard_parameters
from mindspore_hyper.hyper_parallel.session import mesh_of

__all__ = ["hsdp", "HSDPCell", "hsdp_sync_stream"]

LEVELS = ("level1", "level2", "level3")


class HSDPCell:
    """What `hsdp` makes a Cell (its class gains this base, as upstream's does)."""

    def set_requires_grad_sync(self, requires_grad_sync: bool) -> None:
        """Gradient synchronisation stays on (accumulation without it is not supported yet).

        Raises:
            ValueError: not a bool, or False.
        """
        if not isinstance(requires_grad_sync, bool):
            raise ValueError(f"requires_grad_sync must be bool but got {requires_grad_sync!r}")
        if not requires_grad_sync:
            raise ValueError("set_requires_grad_sync(False): gradient accumulation without synchronisation is not "
                             "supported yet; synchronise every step")

    def zero_grads(self) -> None:
        """Nothing to zero: without accumulation no gradient is kept between steps."""

    def set_forward_prefetch_cells(self, hsdp_cell_list) -> None:
        raise ValueError("set_forward_prefetch_cells: prefetch order is not modelled here (gathers run when the Cell "
                         "runs); remove the call")

    def set_backward_prefetch_cells(self, hsdp_cell_list) -> None:
        raise ValueError("set_backward_prefetch_cells: prefetch order is not modelled here; remove the call")


def hsdp_sync_stream() -> None:
    """Wait for asynchronous gradient reductions: there are none (comm_async is refused)."""


def _check(cell, shard_size, threshold, optimizer_level, enable_grad_accumulation, use_eager_hook, grad_scale,
           reduce_dtype, comm_async, comm_fusion, bucket_size) -> None:
    if not isinstance(cell, nn.Cell):
        raise ValueError(f"hsdp: cell's type must be nn.Cell but got {type(cell).__name__}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or (shard_size <= 0 and shard_size != -1):
        raise ValueError(f"hsdp: shard_size must be a positive integer or -1, but got {shard_size!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
        raise ValueError(f"hsdp: threshold must be an integer >= 0 (KB), but got {threshold!r}")
    if optimizer_level not in LEVELS:
        raise ValueError(f"hsdp: optimizer_level should be in {list(LEVELS)}, but got {optimizer_level!r}")
    if not isinstance(grad_scale, float):
        raise ValueError(f"hsdp: grad_scale must be float but got {grad_scale!r}")
    refused = {"enable_grad_accumulation": (enable_grad_accumulation, False), "use_eager_hook": (use_eager_hook, True),
               "reduce_dtype": (reduce_dtype, None), "comm_async": (comm_async, False),
               "comm_fusion": (comm_fusion, False), "bucket_size": (bucket_size, -1)}
    for name, (value, default) in refused.items():
        if value != default:
            raise ValueError(f"hsdp({name}={value!r}): not supported yet; leave the default {default!r}")


def _group_axes(layout, root_ndim: int, sizes, shard_size: int, name: str) -> Tuple[int, ...]:
    """The mesh axes a Parameter is split over: its replicated axes, or the innermost of them
    whose sizes multiply to `shard_size`.

    Raises:
        ValueError: no such innermost axes.
    """
    used = set(layout.sharded_axes()) | set(layout.partial)
    free = tuple(a for a in range(root_ndim) if a not in used)
    if shard_size == -1:
        return free
    for start in range(len(free) + 1):
        if math.prod(sizes[a] for a in free[start:]) == shard_size:
            return free[start:]
    options = sorted({math.prod(sizes[a] for a in free[start:]) for start in range(len(free) + 1)})
    raise ValueError(f"hsdp(shard_size={shard_size}): parameter {name!r}'s data-parallel group splits into "
                     f"innermost groups of {options} devices only")


def hsdp(cell: nn.Cell, shard_size: Optional[int] = -1, threshold: Optional[int] = 64,
         optimizer_level: Optional[str] = "level1", enable_grad_accumulation: Optional[bool] = False,
         use_eager_hook: Optional[bool] = True, grad_scale: Optional[float] = 1.0, reduce_dtype=None,
         comm_async: Optional[bool] = False, comm_fusion: Optional[bool] = False,
         bucket_size: Optional[int] = -1) -> nn.Cell:
    """Apply hybrid sharded data parallelism to `cell` (see module docstring).

    Args:
        cell: the Cell (changed in place and returned; its class gains HSDPCell).
        shard_size: devices each Parameter is split over (-1: its whole data-parallel group).
        threshold: Parameters smaller than this many KB stay unsplit.
        optimizer_level: "level1", "level2" or "level3" (same values; see module docstring).
        grad_scale: factor on the summed gradients.
        enable_grad_accumulation, use_eager_hook, reduce_dtype, comm_async, comm_fusion,
            bucket_size: only their defaults are supported (others are refused, named).

    Raises:
        ValueError: a bad or unsupported argument (named), Parameters on different meshes, no
            mesh, or a shard_size the groups cannot give.
    """
    _check(cell, shard_size, threshold, optimizer_level, enable_grad_accumulation, use_eager_hook, grad_scale,
           reduce_dtype, comm_async, comm_fusion, bucket_size)
    meshes = {}
    for _, param in cell.parameters_and_names():
        view = mesh_of(param)
        if view is not None:
            meshes[id(view.root)] = view
    if len(meshes) > 1:
        raise ValueError("hsdp: the Cell's Parameters are laid out on different root meshes")
    view = next(iter(meshes.values())) if meshes else get_current_mesh()
    mesh = DeviceMesh._view(view.device_type, view.root, tuple(range(view.root.ndim)))
    sizes = mesh.root.device_matrix

    def axes_of(slot):
        return _group_axes(slot.layout, mesh.root.ndim, sizes, shard_size, slot.param.name)

    shard_parameters(cell, mesh, axes_of, reduce="sum", grad_scale=grad_scale, threshold_bytes=threshold * 1024)
    if not isinstance(cell, HSDPCell):
        cell.__class__ = type(f"HSDP{type(cell).__name__}", (HSDPCell, type(cell)), {})
    return cell
