"""HyperParallel's `hsdp` (hybrid sharded data parallel) over `fully_shard`'s machinery.

Each Parameter is split along dimension 0 over its data-parallel group: the dimensions of its
mesh that its layout leaves replicated (or, with `shard_size`, the innermost of them whose sizes
multiply to it: sharded within those, replicated across the rest). As upstream's hsdp does, a
Parameter whose rows that group does not divide is split over fewer devices: gcd(rows, group)
(recorded as `param.hsdp_effective_shard_size`), so hsdp never makes uneven pieces (fully_shard
does, as torch's FSDP2). Gradients are summed over the
group and multiplied by `grad_scale`, as upstream's hsdp does; the values are the same at every
`optimizer_level`, and every level here splits parameters, gradients and optimizer states.

`enable_grad_accumulation=True` (upstream: gradients summed unsynchronised over a pipeline
step's microbatches, synchronised at its last backward, kept until `zero_grads()`) is taken for
Cells a pipeline schedule runs: the schedule already sums each microbatch's synchronised
gradient into `.grad` (a sum of sums: the same values) and `zero_grads()` clears `.grad`. Called
outside a schedule (where upstream would return unsynchronised running sums) such a Cell is
refused.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Iterator, Optional, Tuple

from mindspore import nn

from mindspore_hyper.hyper_parallel.device_mesh import get_current_mesh
from mindspore_hyper.hyper_parallel.fully_shard import shard_parameters
from mindspore_hyper.hyper_parallel.session import mesh_of

__all__ = ["hsdp", "HSDPCell", "hsdp_sync_stream", "run_by_pipeline_schedule"]

LEVELS = ("level1", "level2", "level3")

# How many pipeline-stage forwards this thread is inside (per-rank simulation runs ranks as threads).
_SCHEDULE = threading.local()


@contextlib.contextmanager
def run_by_pipeline_schedule() -> Iterator[None]:
    """Marks a pipeline schedule running a stage's Cell: hsdp Cells with gradient accumulation
    may run inside (see module docstring)."""
    _SCHEDULE.depth = getattr(_SCHEDULE, "depth", 0) + 1
    try:
        yield
    finally:
        _SCHEDULE.depth -= 1


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
        """Clear the gradients kept between steps: the `.grad` a pipeline schedule accumulates
        in the Cell's Parameters (upstream's accumulation buffers)."""
        for param in self.trainable_params():
            param.grad = None

    def __call__(self, *args, **kwargs):
        if getattr(self, "_hsdp_grad_accumulation", False) and not getattr(_SCHEDULE, "depth", 0):
            raise ValueError(f"hsdp(enable_grad_accumulation=True): {type(self).__name__} was called outside a "
                             "pipeline schedule; accumulation is supported for Cells a schedule runs (their .grad "
                             "sums the microbatches); elsewhere pass enable_grad_accumulation=False and add the "
                             "gradients yourself")
        return super().__call__(*args, **kwargs)

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
    if not isinstance(enable_grad_accumulation, bool):
        raise ValueError(f"hsdp: enable_grad_accumulation must be bool but got {enable_grad_accumulation!r}")
    refused = {"use_eager_hook": (use_eager_hook, True),
               "reduce_dtype": (reduce_dtype, None), "comm_async": (comm_async, False),
               "comm_fusion": (comm_fusion, False), "bucket_size": (bucket_size, -1)}
    for name, (value, default) in refused.items():
        if value != default:
            raise ValueError(f"hsdp({name}={value!r}): not supported yet; leave the default {default!r}")


def _group_axes(layout, root_ndim: int, sizes, shard_size: int, name: str, rows: int) -> Tuple[int, ...]:
    """The mesh axes a Parameter is split over, by upstream's rule for its effective shard size:
    the requested size (-1: the whole data-parallel group), capped by the Parameter's `rows`
    (its local dimension 0) and by gcd(rows, group size), so the rows always divide (a 2-row
    weight over 4 devices is split over 2 and replicated over the rest; 3 rows over 4: not
    split). The axes are the innermost replicated ones whose sizes multiply to that size (or to
    the largest such product dividing it, when the gcd falls between axes).

    Raises:
        ValueError: an explicit `shard_size` no innermost axes give.
    """
    used = set(layout.sharded_axes()) | set(layout.partial)
    free = tuple(a for a in range(root_ndim) if a not in used)
    group = math.prod(sizes[a] for a in free)
    products = {math.prod(sizes[a] for a in free[start:]): free[start:] for start in range(len(free) + 1)}
    if shard_size != -1 and shard_size not in products:
        raise ValueError(f"hsdp(shard_size={shard_size}): parameter {name!r}'s data-parallel group splits into "
                         f"innermost groups of {sorted(products)} devices only")
    common = math.gcd(rows, group)
    effective = min(rows if shard_size == -1 or rows < shard_size else shard_size, common) if rows else 1
    if common % effective:
        effective = 1
    return products[max(n for n in products if effective % n == 0)]


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
        enable_grad_accumulation: sum gradients over a pipeline step's microbatches until
            `zero_grads()`: taken for Cells a pipeline schedule runs (module docstring).
        grad_scale: factor on the summed gradients.
        use_eager_hook, reduce_dtype, comm_async, comm_fusion, bucket_size: only their defaults
            are supported (others are refused, named).

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
    mesh = view.view(tuple(range(view.root.ndim)))
    sizes = mesh.root.device_matrix

    def axes_of(slot):
        rows = slot.layout.max_local_shape(slot.global_shape)[0] if slot.global_shape else 0
        axes = _group_axes(slot.layout, mesh.root.ndim, sizes, shard_size, slot.param.name, rows)
        slot.param.hsdp_effective_shard_size = math.prod(sizes[a] for a in axes)  # upstream's attribute
        return axes

    shard_parameters(cell, mesh, axes_of, reduce="sum", grad_scale=grad_scale, threshold_bytes=threshold * 1024)
    if not isinstance(cell, HSDPCell):
        cell.__class__ = type(f"HSDP{type(cell).__name__}", (HSDPCell, type(cell)), {})
    cell._hsdp_grad_accumulation = enable_grad_accumulation
    return cell
