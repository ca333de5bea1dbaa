"""`GradientSync`: a model's data-parallel gradient synchronisation, the same in every runtime.

A parameter read by an op sharded over mesh axes it is replicated on (data parallelism) gets one
gradient contribution per member of that group; its gradient is their sum. Once per step, per
parameter and group, a device runs an AllReduce of the gradient, or with ZeRO-1 along the group
a ReduceScatter to its optimizer slice and, after the update, an AllGather of the updated
slice (ZeRO-1 along part of the group: an AllReduce over the other axes first). Each of these collectives is issued through the model's `GradientSync`, whose method
records it in the model's accounting (backward traffic, caused by the parameter's gradient sync,
the AllGather by the ZeRO gather) where it moves the bytes:

- where every member of the group is in this process (simulation, dry run), autograd (or the
  shape program) has summed the members' contributions already: `parameter_sum` is the
  collective a device runs, with nothing left to move in this process;
- where a process holds one member (msrun), `all_reduce`, `all_reduce_async`, `reduce_scatter`
  and `all_gather` move host arrays through the runtime's `Collectives` backend (its
  `communicator(group)`, the one its autograd collectives use).

`sum_scalar` is the global gradient norm's AllReduce of each device's squared-norm share (one
float64 over the mesh, runtime/grad_clip.py), recorded under its cause ("clip grad norm") in
either case.

Bytes follow the planner's ring convention (`ring_send_bytes`); a parameter's sum is recorded
once per step (`claim`) however many ops read the parameter and however many micro-batches
contribute.
"""
from __future__ import annotations

from typing import Optional, Sequence, Set, Tuple

import numpy as np

from mindspore_hyper.comm.collective_cause import grad_sync_cause, zero_gather_cause
from mindspore_hyper.comm.collectives import AxisGroup, ring_send_bytes

__all__ = ["GradientSync", "zero_along", "member_group", "SCALAR_BYTES"]

SCALAR_BYTES = np.dtype(np.float64).itemsize  # a summed scalar (a squared-norm share) travels as one float64


def zero_along(mesh, slot, group: AxisGroup) -> Optional[Tuple[str, int]]:
    """The part of `group` the parameter of `slot` has its optimizer states split over (ZeRO-1):
    (its axis name, "data" or "data+tensor", and its size in devices); None when none."""
    axes = set(group.axis.split("+"))
    zero = [a for a in slot.zero_axes if mesh.alias_names[a] in axes]
    if not zero:
        return None
    return "+".join(mesh.alias_names[a] for a in zero), int(np.prod([mesh.device_matrix[a] for a in zero]))


class GradientSync:
    """The gradient collectives of one model (see module docstring).

    Args:
        accounting: the model's `Accounting` (the collectives are recorded there as backward traffic).
        collectives: the runtime's collectives backend; under msrun it moves the bytes
            (`communicator(group)`), in one process it is not called.
    """

    def __init__(self, accounting, collectives):
        self.accounting = accounting
        self.collectives = collectives
        self._claimed: Set[Tuple[int, str]] = set()

    def begin_step(self) -> None:
        """A new step: every parameter's sum is recorded again."""
        self._claimed.clear()

    def claim(self, pid: int, group: AxisGroup) -> bool:
        """Whether the sum of parameter `pid` (its `id`) over `group` is not recorded yet this step
        (and mark it recorded)."""
        key = (pid, group.axis)
        if key in self._claimed:
            return False
        self._claimed.add(key)
        return True

    def _record(self, kind: str, axis: str, send_bytes: int, input_bytes: int, cause: str) -> None:
        self.accounting.record_comm(kind, axis, send_bytes, input_bytes, backward=True, cause=cause)

    # -- every member in this process -------------------------------------------------------------
    def parameter_sum(self, param_bytes: int, group: AxisGroup, zero: Optional[Tuple[str, int]], name: str) -> None:
        """Parameter `name`'s gradient sum over `group` on a device holding `param_bytes` of it,
        its members' contributions summed in this process already: an AllReduce, or with
        `zero` (`zero_along`: the part of the group its optimizer states are split over, ZeRO-1)
        a ReduceScatter over that part plus the AllGather of the updated slice (param_bytes // n
        per device, (n-1)/n of param_bytes sent), after an AllReduce over the group's other axes
        where the part is not the whole group (what a process runs under msrun)."""
        n, axis = group.size, group.axis
        if zero is not None and zero[1] < n:  # first summed among the devices of one optimizer slice
            rest = "+".join(a for a in axis.split("+") if a not in zero[0].split("+"))
            self._record("AllReduce", rest, ring_send_bytes("AllReduce", n // zero[1], param_bytes), param_bytes,
                         grad_sync_cause(name))
        if zero is not None:
            axis, n = zero
            self._record("ReduceScatter", axis, ring_send_bytes("ReduceScatter", n, param_bytes), param_bytes,
                         grad_sync_cause(name))
            self._record("AllGather", axis, ring_send_bytes("ReduceScatter", n, param_bytes), param_bytes // n,
                         zero_gather_cause(name))
        else:
            self._record("AllReduce", axis, ring_send_bytes("AllReduce", n, param_bytes), param_bytes,
                         grad_sync_cause(name))

    # -- one member per process -------------------------------------------------------------------
    def all_reduce(self, array: np.ndarray, group: AxisGroup, names: Sequence[str] = ()) -> np.ndarray:
        """The sum of `array` over `group`'s processes; recorded as the gradient sync of the
        parameters `names` (none: not recorded, e.g. a partial sum a bucket records)."""
        if names:
            self._record("AllReduce", group.axis, ring_send_bytes("AllReduce", group.size, array.nbytes),
                         array.nbytes, grad_sync_cause(*names))
        return self.collectives.communicator(group).all_reduce(array)

    def all_reduce_async(self, array: np.ndarray, group: AxisGroup, names: Sequence[str] = ()):
        """`all_reduce`, queued in the communication library's aggregator: returns a handle whose
        `wait(timeout)` gives the sum."""
        if names:
            self._record("AllReduce", group.axis, ring_send_bytes("AllReduce", group.size, array.nbytes),
                         array.nbytes, grad_sync_cause(*names))
        return self.collectives.communicator(group).all_reduce_async(array)

    def reduce_scatter(self, bucket: np.ndarray, group: AxisGroup, names: Sequence[str]) -> np.ndarray:
        """Row i of the sum over `group`'s processes of `bucket` (one row per member), on member i:
        the ZeRO-1 gradient sync of the parameters `names`, laid side by side in the rows."""
        self._record("ReduceScatter", group.axis, ring_send_bytes("ReduceScatter", group.size, bucket.nbytes),
                     bucket.nbytes, grad_sync_cause(*names))
        return self.collectives.communicator(group).reduce_scatter(bucket, dim=0)[0]

    def all_gather(self, part: np.ndarray, dim: int, group: AxisGroup, name: str) -> np.ndarray:
        """The members' `part`s of parameter `name` concatenated along `dim`: the AllGather of
        its ZeRO-1 slices after the update."""
        self._record("AllGather", group.axis, ring_send_bytes("AllGather", group.size, part.nbytes), part.nbytes,
                     zero_gather_cause(name))
        return self.collectives.communicator(group).all_gather(np.ascontiguousarray(part), dim=dim)

    # -- either ---------------------------------------------------------------------------------
    def sum_scalar(self, value: float, group: AxisGroup, cause: str = "") -> float:
        """A float summed over `group`'s members: one AllReduce of a float64 (8 bytes), recorded
        under `cause` when one is given (the global gradient norm's "clip grad norm"); "" records
        nothing, nor does a group of one device (no collective runs). Where every member is in
        this process, `value` is the sum already (computed from the global tensors) and nothing
        moves; else the sum of the processes' values moves through the group's communicator."""
        if cause and group.size > 1:
            self._record("AllReduce", group.axis, ring_send_bytes("AllReduce", group.size, SCALAR_BYTES),
                         SCALAR_BYTES, cause)
        if len(group.local) == group.size:
            return float(value)
        return float(self.collectives.communicator(group).all_reduce(np.array([value], np.float64))[0])


def member_group(axis: str, ranks: Tuple[int, ...], rank: int, records: bool = True) -> AxisGroup:
    """The group of global `ranks` (member order) as seen by the process of `rank`, one of them.

    Raises:
        ValueError: `rank` is not one of `ranks`.
    """
    ranks = tuple(ranks)
    if rank not in ranks:
        raise ValueError(f"member_group: rank {rank} is not a member of group {axis!r} {ranks}")
    return AxisGroup(axis, ranks, (ranks.index(rank),), records)

