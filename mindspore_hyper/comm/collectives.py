"""One vocabulary for the collectives a DTensor runtime calls, whatever moves the bytes.

A collective runs over an `AxisGroup`: the devices along one or more mesh axes. The caller
passes the group members this process holds (every member in simulation, one under msrun),
ordered as `group.local`, and gets one result per member back. Results are differentiable
MindSpore tensors under one gradient convention: a tensor replicated over a group holds the
full gradient on every member, a sharded tensor the gradient of its shard, a Partial tensor the
gradient of the whole sum. Hence the backward of each collective:

=================  ==========================  ===============================================
forward            backward                    why
=================  ==========================  ===============================================
all_reduce         identity                    the reduced tensor's gradient is every input's
all_gather         local slice                 (ReduceScatter with ``grad_partial=True``: the
                                               consumers each hold a partial gradient)
reduce_scatter     all_gather                  each input needs the whole gradient
all_to_all         the inverse all_to_all
local_slice        all_gather                  the replicated input needs the whole gradient
make_partial       identity
fan_out            all_reduce                  a replicated input read by a sharded op gets one
                                               partial gradient per member
=================  ==========================  ===============================================

`ProcessCollectives` also has `ring_shift_async` (member i's tensors to member i+1, posted to a
sender thread) and `permute_chunks` (chunks to new owners), which ring attention uses under msrun;
they are not autograd nodes (ring attention has its own backward, which calls them too). In
simulation the ring reads the other members' tensors directly. Its `communicator(group)` (the
group's numpy communicator, the one its collectives move bytes through) is what a model's
`GradientSync` (runtime/gradient_sync.py) moves host gradient arrays through under msrun.

Backends: `InProcessCollectives` (MindSpore ops, all members in this process),
`LibraryCollectives` (the C++ library's in-process transport), `ProcessCollectives` (one member
per process over the shared-memory or MindSpore transport). A backend reports what its backward
pass moves to `recorder(kind, axis, send_bytes, input_bytes, cause)` when the group's `records` flag
is set (one member group per device is enough for per-device accounting); `cause` is the
`collective_cause` current when the collective's forward ran.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Sequence, Tuple

from mindspore import Tensor

__all__ = ["AxisGroup", "Collectives", "Recorder", "ring_send_bytes", "on_gradient", "REDUCE_OPS"]

REDUCE_OPS = ("sum", "avg", "max", "min")

Recorder = Callable[[str, str, int, int, str], None]  # (kind, axis, send_bytes, input_bytes, cause)


@dataclass(frozen=True)
class AxisGroup:
    """The devices of one collective.

    Attributes:
        axis: the mesh axis name(s) it runs over ("data", or "data+tensor"), for records.
        ranks: global ranks of the members, in member order.
        local: indices (into `ranks`) of the members this process holds, ascending.
        records: whether this call reports its backward traffic (see module docstring).
    """

    axis: str
    ranks: Tuple[int, ...]
    local: Tuple[int, ...]
    records: bool = True

    def __post_init__(self):
        if not self.ranks:
            raise ValueError("AxisGroup: ranks must not be empty")
        if not self.local or any(not 0 <= i < len(self.ranks) for i in self.local):
            raise ValueError(f"AxisGroup: local={self.local} must index ranks {self.ranks}")

    @property
    def size(self) -> int:
        return len(self.ranks)

    @classmethod
    def whole(cls, size: int, axis: str = "group") -> "AxisGroup":
        """All `size` members in this process (simulation), ranks 0..size-1."""
        return cls(axis, tuple(range(size)), tuple(range(size)))


def ring_send_bytes(kind: str, n: int, input_bytes: int) -> int:
    """Bytes one device sends in a ring `kind` over `n` devices with `input_bytes` of input
    (the planner's convention: AllGather (n-1)B, ReduceScatter/AllToAll (n-1)/n B,
    AllReduce 2(n-1)/n B)."""
    if kind == "AllGather":
        return (n - 1) * input_bytes
    if kind in ("ReduceScatter", "AllToAll"):
        return (n - 1) * input_bytes // n
    if kind == "AllReduce":
        return 2 * (n - 1) * input_bytes // n
    raise ValueError(f"ring_send_bytes: unknown collective kind {kind!r}")


class Collectives(Protocol):
    """Differentiable collectives over an AxisGroup; `members` are the local members' tensors."""

    def all_reduce(self, members: Sequence[Tensor], op: str, group: AxisGroup) -> List[Tensor]:
        """Reduce by `op` (sum, avg, max, min); every member gets the result."""

    def all_gather(self, members: Sequence[Tensor], dim: int, group: AxisGroup,
                   grad_partial: bool = False) -> List[Tensor]:
        """Concatenate along `dim` in member order. `grad_partial`: the result's consumers each
        hold a partial gradient, so the backward reduce-scatters instead of slicing."""

    def reduce_scatter(self, members: Sequence[Tensor], dim: int, op: str, group: AxisGroup) -> List[Tensor]:
        """Reduce by `op`; member i keeps chunk i of `dim`."""

    def all_to_all(self, members: Sequence[Tensor], split_dim: int, concat_dim: int,
                   group: AxisGroup) -> List[Tensor]:
        """Member i sends chunk j of `split_dim` to member j, which concatenates along `concat_dim`."""

    def local_slice(self, tensor: Tensor, dim: int, group: AxisGroup) -> List[Tensor]:
        """A replicated tensor -> each local member's chunk of `dim` (no communication)."""

    def make_partial(self, tensor: Tensor, op: str, group: AxisGroup) -> List[Tensor]:
        """A replicated tensor -> Partial(op) values (for sum: zeros except on member 0)."""

    def fan_out(self, tensor: Tensor, group: AxisGroup) -> Tensor:
        """A replicated tensor read by an op sharded over the group (identity forward); the
        backward sums the members' partial gradients."""

    def broadcast(self, members: Sequence[Tensor], root: int, group: AxisGroup) -> List[Tensor]:
        """Every member gets member `root`'s tensor."""


def check_members(members: Sequence[Tensor], group: Optional[AxisGroup], name: str) -> AxisGroup:
    """The group of an in-process call (all members local when None); checks the member count."""
    if group is None:
        group = AxisGroup.whole(len(members))
    if len(members) != len(group.local):
        raise ValueError(f"{name}: {len(members)} member tensors for the {len(group.local)} local members of "
                         f"group {group.axis!r} {group.ranks}")
    return group


def on_gradient(tensor: Tensor, hook: Callable[[Tensor], Optional[Tensor]]) -> bool:
    """Register `hook` on `tensor`'s gradient; False when no gradient can reach it (MindSpore
    refuses hooks on tensors outside gradient recording)."""
    try:
        tensor.register_hook(hook)
    except RuntimeError:
        return False
    return True
