"""HyperParallel's `hsdp` (hybrid sharded data parallel) over `fully_shard`'s machinery.

Each Parameter is split along dimension 0 over its data-parallel group: the dimensions of its
mesh that its layout leaves replicated (or, with `shard_size`, the innermost of them whose sizes
multiply to it: sharded within those, replicated across the rest); a Cell on no mesh, in a
script that made none, is data parallel over the whole job, as upstream's (`_job_mesh`). As upstream's hsdp does, a
Parameter whose rows that group does not divide is split over fewer devices: gcd(rows, group)
(recorded as `param.hsdp_effective_shard_size`), so hsdp never makes uneven pieces (fully_shard
does, as torch's FSDP2). Gradients are summed over the
group and multiplied by `grad_scale`, as upstream's hsdp does; the values are the same at every
`optimizer_level`, and every level here splits parameters, gradients and optimizer states.

`enable_grad_accumulation=True` (upstream's `requires_acc_grad`): each backward adds the Cell's
gradients to a running sum kept until `zero_grads()` and returns it; with
`set_requires_grad_sync(False)` the sum is each rank's own, unsynchronised, and the first
backward with it True reduces it once (`grad_accumulation.py`, style "running_sum"; in the
one-process simulation the running sum is the group's, see there). Inside a pipeline schedule
the schedule itself sums each microbatch's synchronised gradient into `.grad` (a sum of sums: the
same values), so there the running sums and the flag are not used; `zero_grads()` clears both.

`comm_async`, `comm_fusion` and `bucket_size` choose, upstream, whether gradient reductions run
on a side stream (awaited by `hsdp_sync_stream()`) and whether they are fused into buckets: when
collectives run, not what they compute. Here every reduction runs synchronously and unfused with
any of them, with the same values (`hsdp_sync_stream()` returns at once). Likewise
`set_forward_prefetch_cells` / `set_backward_prefetch_cells` choose which Cells' gathers upstream
issues early, while another Cell computes: here gathers run when each Cell runs, so the setters
check and record their lists (`forward_prefetch`, `backward_prefetch`).

`reduce_dtype` (say float32 for float16 Parameters): as upstream's, each rank's gradient is cast
to it before the data-parallel reduction and the result cast back to the Parameter's dtype, so
the ranks' gradients are added in float32 and rounded once (`fully_shard._gather`). The gather
then moves the Parameter in `reduce_dtype` too (its backward is the reduce-scatter): twice
upstream's float16 gather bytes in the report, the same values. With a global batch (DTensor
inputs split over the data-parallel mesh) the ranks' gradients are summed by the ops reading the
gathered copy, in its dtype, so that combination is refused.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Iterator, Optional, Tuple

import numpy as np
from mindspore import nn

from mindspore_hyper.dtensor.dtensor import is_float
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh, get_current_mesh
from mindspore_hyper.hyper_parallel.fully_shard import shard_parameters
from mindspore_hyper.hyper_parallel.fully_shard_policies import FLOAT_DTYPES
from mindspore_hyper.hyper_parallel.grad_accumulation import GradAccumulation
from mindspore_hyper.hyper_parallel.session import current_meshes, job_size, mesh_of

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
        """Whether the next backwards reduce the accumulated gradients over the data-parallel
        ranks (module docstring): False on all micro-batches but the last, True on the last.
        Set on this Cell and the hsdp Cells inside it, as upstream's; read when a forward runs.

        Raises:
            ValueError: not a bool; False on a Cell made without `enable_grad_accumulation=True`
                (upstream synchronises such a Cell's every backward whatever the flag says).
        """
        if not isinstance(requires_grad_sync, bool):
            raise ValueError(f"requires_grad_sync must be bool but got {requires_grad_sync!r}")
        for _, cell in self.cells_and_names():
            if not isinstance(cell, HSDPCell):
                continue
            accumulation = cell.fsdp_state.accumulation
            if accumulation is None and not requires_grad_sync:
                raise ValueError(f"set_requires_grad_sync(False): {type(cell).__name__} was made by hsdp without "
                                 "enable_grad_accumulation=True, whose backwards always synchronise (upstream "
                                 "ignores the flag there); pass enable_grad_accumulation=True to hsdp")
            if accumulation is not None:
                accumulation.sync = requires_grad_sync

    def zero_grads(self) -> None:
        """Clear the gradients kept between steps: the running sums of `enable_grad_accumulation`
        and the `.grad` a pipeline schedule accumulates in the Cell's Parameters (upstream's
        accumulation buffers)."""
        accumulation = self.fsdp_state.accumulation
        if accumulation is not None:
            accumulation.clear()
        for param in self.trainable_params():
            param.grad = None

    def __call__(self, *args, **kwargs):
        accumulation = self.fsdp_state.accumulation
        if accumulation is not None:  # a schedule sums its microbatches' gradients itself
            accumulation.paused = bool(getattr(_SCHEDULE, "depth", 0))
        return super().__call__(*args, **kwargs)

    def set_forward_prefetch_cells(self, hsdp_cell_list) -> None:
        """Record the hsdp Cells whose gathers upstream issues early, while this Cell's forward
        computes (module docstring: an order of collectives, the same values).

        Raises:
            ValueError: not a list or tuple of hsdp Cells.
        """
        object.__setattr__(self, "forward_prefetch", _hsdp_cells(hsdp_cell_list, "set_forward_prefetch_cells"))

    def set_backward_prefetch_cells(self, hsdp_cell_list) -> None:
        """Record the hsdp Cells whose gathers upstream issues early, while this Cell's backward
        computes (same values).

        Raises:
            ValueError: not a list or tuple of hsdp Cells.
        """
        object.__setattr__(self, "backward_prefetch", _hsdp_cells(hsdp_cell_list, "set_backward_prefetch_cells"))


def _hsdp_cells(cells, what: str) -> list:
    if not isinstance(cells, (list, tuple)):
        raise ValueError(f"{what}: hsdp_cell_list must be a list or tuple of hsdp Cells, but got {cells!r}")
    for cell in cells:
        if not isinstance(cell, HSDPCell):
            raise ValueError(f"{what}: hsdp_cell_list must hold hsdp Cells only, but got a "
                             f"{type(cell).__name__} (apply hsdp to it first)")
    return list(cells)


def hsdp_sync_stream() -> None:
    """Wait for asynchronous gradient reductions (upstream's `comm_async=True`): there are none
    here, every reduction has finished when the backward returns, so it returns at once."""


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
    for name, value in (("use_eager_hook", use_eager_hook), ("comm_async", comm_async), ("comm_fusion", comm_fusion)):
        if not isinstance(value, bool):
            raise ValueError(f"hsdp: {name} must be bool but got {value!r}")
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or (bucket_size < 0 and bucket_size != -1):
        raise ValueError(f"hsdp: bucket_size must be an integer >= 0 (bytes) or -1, but got {bucket_size!r}")
    if not use_eager_hook:
        raise ValueError("hsdp(use_eager_hook=False): upstream then registers its gradient hooks as a compiled "
                         "MindSpore graph pass (its plugin library, for ms.jit graphs); this package runs hsdp's "
                         "hooks eagerly (PyNative) only. Pass use_eager_hook=True and call the gradient function "
                         "without ms.jit (parallelize_value_and_grad or mindspore.value_and_grad)")
    if reduce_dtype is not None and not is_float(reduce_dtype):
        raise ValueError(f"hsdp: reduce_dtype must be a floating mindspore dtype ({', '.join(map(str, FLOAT_DTYPES))})"
                         f" or None, but got {reduce_dtype!r}")


def _job_mesh(shard_size: int) -> DeviceMesh:
    """The data-parallel mesh of a Cell on no mesh, with no mesh made (upstream's hsdp then uses
    the whole job): the job's N ranks, as (N / s, s) ("dp_replicate", "dp_shard") for a
    shard_size s below N, so each split group is s consecutive ranks (upstream's
    rank - rank % s ..); (N,) ("dp",) otherwise (shard_size -1 or at least N: the whole job).

    Raises:
        ValueError: a shard_size below N that does not divide N.
    """
    job = job_size()
    if shard_size == -1 or shard_size >= job:
        return DeviceMesh("cpu", list(range(job)), mesh_dim_names=("dp",))
    if job % shard_size:
        raise ValueError(f"hsdp: shard_size={shard_size} does not divide the job's {job} devices (the Cell is on "
                         "no device mesh, so its data-parallel group is the whole job); pass a divisor or -1")
    return DeviceMesh("cpu", np.arange(job).reshape(job // shard_size, shard_size),
                      mesh_dim_names=("dp_replicate", "dp_shard"))


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
        shard_size: devices each Parameter is split over (-1: its whole data-parallel group); a
            Parameter's own `hsdp_shard_size` attribute, when set, takes its place (upstream's).
        threshold: Parameters smaller than this many KB stay unsplit.
        optimizer_level: "level1", "level2" or "level3" (same values; see module docstring).
        enable_grad_accumulation: sum gradients over backwards until `zero_grads()`, reduced when
            `set_requires_grad_sync` is True (module docstring).
        grad_scale: factor on the summed gradients.
        use_eager_hook: True only (False: upstream's graph-mode hooks, refused).
        reduce_dtype: the dtype gradients are reduced in (None: the Parameters' own): each
            floating Parameter's gradient is cast to it before the data-parallel reduction and
            back after, as upstream's (module docstring).
        comm_async, comm_fusion, bucket_size: bools and a bucket size (bytes, >= 0 or -1):
            timing choices upstream, taken with the same values (module docstring).

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
    if meshes:
        view = next(iter(meshes.values()))
    else:
        view = get_current_mesh() if current_meshes() else _job_mesh(shard_size)
    mesh = view.view(tuple(range(view.root.ndim)))
    sizes = mesh.root.device_matrix

    def axes_of(slot):
        rows = slot.layout.max_local_shape(slot.global_shape)[0] if slot.global_shape else 0
        size = getattr(slot.param, "hsdp_shard_size", shard_size)  # upstream's per-Parameter setting
        if isinstance(size, bool) or not isinstance(size, int) or (size <= 0 and size != -1):
            raise ValueError(f"hsdp: parameter {slot.param.name!r}'s hsdp_shard_size must be a positive integer or -1, "
                             f"but got {size!r}")
        axes = _group_axes(slot.layout, mesh.root.ndim, sizes, size, slot.param.name, rows)
        slot.param.hsdp_effective_shard_size = math.prod(sizes[a] for a in axes)  # upstream's attribute
        return axes

    shard_parameters(cell, mesh, axes_of, reduce="sum", grad_scale=grad_scale, threshold_bytes=threshold * 1024,
                     reduce_dtype=reduce_dtype)
    if not isinstance(cell, HSDPCell):
        cell.__class__ = type(f"HSDP{type(cell).__name__}", (HSDPCell, type(cell)), {})
    if enable_grad_accumulation:
        cell.fsdp_state.accumulation = GradAccumulation("running_sum")
    return cell
