"""Collectives with one group member per process (msrun), over a numpy communicator.

Each collective's forward moves the bytes through the group's communicator (the shared-memory
transport on one host, or MindSpore's transport across hosts); its backward implements the
backward of `mindspore_hyper.comm.collectives`, moving the gradient bytes the same way and
reporting them to the recorder under the collective cause of its forward. A call is one node of
MindSpore's PyNative autograd graph through MindSpore's custom autograd function
(`mindspore.common._Function`, torch's `autograd.Function`), not a Cell with a custom `bprop`:
`mindspore.value_and_grad` differentiates both, but MindSpore's `run_backward`, which torch-style
`loss.backward()` runs (`hyper_parallel/autograd_compat.py`), stops at a Cell's bprop ("The
pointer[top_cell_] is null", MindSpore 2.10).

A communicator is anything with numpy-level `all_reduce(x, op)`, `all_gather(x, dim)`,
`reduce_scatter(x, dim, op)`, `all_to_all(x, split_dim, concat_dim)`, `broadcast(x, root)`
and (for `ring_shift_async` and `permute_chunks`, ring attention's moves, which are not autograd
nodes) `send(x, peer)` / `recv(shape, dtype, peer)`; `communicator_for(ranks)` returns the one of a
group of global ranks.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Deque, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Tensor, ops
from mindspore.common import _Function
from mindspore.common import dtype as mstype

from mindspore_hyper.comm._common import CommError
from mindspore_hyper.comm.collective_cause import current_cause
from mindspore_hyper.comm.collectives import AxisGroup, Recorder, ring_send_bytes
from mindspore_hyper.comm.inprocess_collectives import nbytes_of
from mindspore_hyper.comm.ring_shift_async import RING_TIMINGS_KEPT, RingSender, RingShiftHandle, RingShiftTiming

__all__ = ["ProcessCollectives"]


def _array(t: Tensor) -> np.ndarray:
    a = t.asnumpy()
    return a.view(np.uint8) if a.dtype == np.bool_ else a


def _tensor(a: np.ndarray, like: Tensor) -> Tensor:
    if like.dtype == mstype.bool_:
        a = a.view(np.bool_)
    return Tensor(np.require(a, requirements="C"), dtype=like.dtype)  # (ascontiguousarray makes 0-d 1-d)


_NUMPY_DTYPES = {mstype.float16: np.dtype(np.float16), mstype.float32: np.dtype(np.float32),
                 mstype.float64: np.dtype(np.float64), mstype.int8: np.dtype(np.int8), mstype.int16: np.dtype(np.int16),
                 mstype.int32: np.dtype(np.int32), mstype.int64: np.dtype(np.int64), mstype.uint8: np.dtype(np.uint8),
                 mstype.bool_: np.dtype(np.bool_)}


def _numpy_dtype(dtype):
    """numpy's dtype for a MindSpore dtype, None where `adopt` keeps the copying path (bfloat16, ...)."""
    return _NUMPY_DTYPES.get(dtype)


def adopt(a: np.ndarray, like: Tensor) -> Tensor:
    """A Tensor of `like`'s dtype on the memory of `a`, an array the caller hands over (a
    collective's fresh result, which nobody else holds or writes): `Tensor.from_numpy` shares
    it, saving `_tensor`'s copy (~12 ms for 3 MB on the benchmark machine vs ~1 us). Falls back
    to `_tensor` when the dtypes differ (e.g. a bfloat16 tensor) or the array is read-only."""
    if like.dtype == mstype.bool_:
        a = a.view(np.bool_)
    a = np.require(a, requirements="C")
    if a.ndim == 0 or not a.flags.writeable or a.dtype != _numpy_dtype(like.dtype):
        return _tensor(a, like)
    return Tensor.from_numpy(a)


def _named_call(group: AxisGroup, index: int, what: str, fn, *args):
    """Run a communicator call; a failure names the group's global ranks."""
    try:
        return fn(*args)
    except CommError as exc:
        raise type(exc)(f"{what} over mesh axis {group.axis!r} (global ranks {list(group.ranks)}, "
                        f"this is rank {group.ranks[index]}): {exc}") from None


class _Collective:
    """One collective over `group`: `forward(x)` moves the data through `self.comm`, `backward(x,
    out, dout, cause)` the gradient (recorded under `cause`, the collective cause of the forward).
    `keeps_values`: whether the backward reads `x` and `out` (they are kept for it only then)."""

    keeps_values = False

    def __init__(self, owner: "ProcessCollectives", group: AxisGroup):
        self.owner, self.group = owner, group
        self.comm = owner.communicator(group)
        self.index = group.local[0]

    def record(self, kind: str, input_bytes: int, cause: str) -> None:
        recorder = self.owner.recorder
        if recorder is not None and self.group.records and self.group.size > 1:
            recorder(kind, self.group.axis, ring_send_bytes(kind, self.group.size, input_bytes), input_bytes, cause)

    def call(self, what: str, fn, *args):
        return _named_call(self.group, self.index, what, fn, *args)

    def __call__(self, x: Tensor) -> Tensor:
        return _AutogradNode.apply(x, self)


class _AutogradNode(_Function):
    """A collective as one autograd node of MindSpore's PyNative graph (MindSpore's custom autograd
    function, torch's `autograd.Function`): both `mindspore.value_and_grad` and `run_backward`
    (torch-style `loss.backward()`, `hyper_parallel/autograd_compat.py`) differentiate it, where
    `run_backward` cannot run a Cell's custom `bprop`."""

    @staticmethod
    def forward(ctx, x, collective):  # pylint: disable=arguments-differ
        out = collective.forward(x)
        ctx.collective, ctx.cause = collective, current_cause()
        if collective.keeps_values:
            ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, dout):  # pylint: disable=arguments-differ
        x, out = ctx.saved_tensors if ctx.collective.keeps_values else (None, None)
        return ctx.collective.backward(x, out, dout, ctx.cause), None


class _AllReduce(_Collective):
    def __init__(self, owner, group, op: str):
        super().__init__(owner, group)
        self.op = op
        self.keeps_values = op in ("max", "min")

    def forward(self, x):
        return adopt(self.call("all_reduce", self.comm.all_reduce, _array(x), self.op), x)

    def backward(self, x, out, dout, cause):
        if self.op == "sum":
            return dout
        if self.op == "avg":
            return dout / self.group.size
        hit = ops.cast(ops.equal(x, out), dout.dtype)  # max/min: the gradient goes to the winners
        self.record("AllReduce", nbytes_of(hit), cause)
        count = adopt(self.call("all_reduce", self.comm.all_reduce, hit.asnumpy(), "sum"), hit)
        return dout * hit / count


class _AllGather(_Collective):
    def __init__(self, owner, group, dim: int, grad_partial: bool):
        super().__init__(owner, group)
        self.dim, self.grad_partial = dim, grad_partial

    def forward(self, x):
        return adopt(self.call("all_gather", self.comm.all_gather, _array(x), self.dim), x)

    def backward(self, x, out, dout, cause):
        if self.grad_partial:
            self.record("ReduceScatter", nbytes_of(dout), cause)
            return adopt(self.call("reduce_scatter", self.comm.reduce_scatter, dout.asnumpy(), self.dim, "sum"), dout)
        return ops.split(dout, dout.shape[self.dim] // self.group.size, self.dim)[self.index]


class _ReduceScatter(_Collective):
    def __init__(self, owner, group, dim: int, op: str):
        super().__init__(owner, group)
        self.dim, self.op = dim, op
        self.keeps_values = op in ("max", "min")

    def forward(self, x):
        if self.op in ("max", "min"):
            full = self.call("all_reduce", self.comm.all_reduce, _array(x), self.op)
            return adopt(np.array_split(full, self.group.size, axis=self.dim)[self.index], x)
        return adopt(self.call("reduce_scatter", self.comm.reduce_scatter, _array(x), self.dim, self.op), x)

    def backward(self, x, out, dout, cause):
        self.record("AllGather", nbytes_of(dout), cause)
        gathered = adopt(self.call("all_gather", self.comm.all_gather, dout.asnumpy(), self.dim), dout)
        if self.op == "avg":
            gathered = gathered / self.group.size
        elif self.op in ("max", "min"):
            full = adopt(self.call("all_reduce", self.comm.all_reduce, _array(x), self.op), x)
            hit = ops.cast(ops.equal(x, full), dout.dtype)
            count = adopt(self.call("all_reduce", self.comm.all_reduce, hit.asnumpy(), "sum"), hit)
            gathered = gathered * hit / count
        return gathered


class _AllToAll(_Collective):
    def __init__(self, owner, group, split_dim: int, concat_dim: int):
        super().__init__(owner, group)
        self.split_dim, self.concat_dim = split_dim, concat_dim

    def forward(self, x):
        return adopt(self.call("all_to_all", self.comm.all_to_all, _array(x), self.split_dim, self.concat_dim), x)

    def backward(self, x, out, dout, cause):
        self.record("AllToAll", nbytes_of(dout), cause)
        return adopt(self.call("all_to_all", self.comm.all_to_all, dout.asnumpy(), self.concat_dim, self.split_dim),
                     dout)


class _Ring:
    """Point-to-point moves over one group's communicator (not autograd nodes: ring attention has
    its own backward): `shift` moves this member's array one step around the ring (to member
    i+1, member i-1's arriving; even members send first, odd ones receive first: no cycle of
    waits) and is what the group's sender thread runs for `ring_shift_async`; `permute` moves
    chunks to their new owners."""

    def __init__(self, owner: "ProcessCollectives", group: AxisGroup):
        self.group, self.index = group, group.local[0]
        self.comm = owner.communicator(group)
        self.sender = RingSender(self.shift, f"ring-shift {group.axis} {list(group.ranks)}")

    def call(self, what: str, fn, *args):
        return _named_call(self.group, self.index, what, fn, *args)

    def shift(self, a: np.ndarray) -> np.ndarray:
        n, i = self.group.size, self.index
        to, source = (i + 1) % n, (i - 1) % n
        if i % 2 == 0:
            self.call("ring send", self.comm.send, a, to)
            return self.call("ring recv", self.comm.recv, a.shape, a.dtype, source)
        received = self.call("ring recv", self.comm.recv, a.shape, a.dtype, source)
        self.call("ring send", self.comm.send, a, to)
        return received

    def permute(self, arrays: Sequence[np.ndarray], sources: Sequence[int]) -> List[Optional[np.ndarray]]:
        """Member i holds chunks i*p .. i*p+p-1 of a global order (p = len(arrays), the same
        shape and dtype everywhere) and gets chunks sources[i*p] .. sources[i*p+p-1]: the
        received ones, None where the chunk is this member's own already. The moves
        run in one global order (by the pair of members, then the destination), each member doing
        its own in that order: the first unfinished move always has both ends at it, so the
        blocking sends and receives never wait on each other in a cycle."""
        p, me = len(arrays), self.index
        result: List[Optional[np.ndarray]] = [None] * p
        moves = sorted((min(c // p, k // p), max(c // p, k // p), k, c) for k, c in enumerate(sources))
        for _, _, k, c in moves:
            source, target = c // p, k // p
            if source == me and target != me:
                self.call("chunk send", self.comm.send, arrays[c % p], target)
            elif target == me and source != me:
                like = arrays[k % p]
                result[k % p] = self.call("chunk recv", self.comm.recv, like.shape, like.dtype, source)
        return result


class _LocalSlice(_Collective):
    def __init__(self, owner, group, dim: int, record: bool):
        super().__init__(owner, group)
        self.dim, self.records = dim, record

    def forward(self, x):
        return ops.split(x, x.shape[self.dim] // self.group.size, self.dim)[self.index]

    def backward(self, x, out, dout, cause):
        if self.records:
            self.record("AllGather", nbytes_of(dout), cause)
        return adopt(self.call("all_gather", self.comm.all_gather, dout.asnumpy(), self.dim), dout)


class _MakePartialSum(_Collective):
    def forward(self, x):
        return x if self.index == 0 else ops.zeros_like(x)

    def backward(self, x, out, dout, cause):
        return dout  # every member holds the whole sum's gradient


class _FanOut(_Collective):
    def forward(self, x):
        return x

    def backward(self, x, out, dout, cause):
        self.record("AllReduce", nbytes_of(dout), cause)
        return adopt(self.call("all_reduce", self.comm.all_reduce, dout.asnumpy(), "sum"), dout)


class _Broadcast(_Collective):
    def __init__(self, owner, group, root: int):
        super().__init__(owner, group)
        self.root = root

    def forward(self, x):
        return adopt(self.call("broadcast", self.comm.broadcast, _array(x), self.root), x)

    def backward(self, x, out, dout, cause):
        return dout if self.index == self.root else ops.zeros_like(dout)


class ProcessCollectives:
    """One member per process (see module docstring).

    Args:
        communicator_for: global ranks of a group (member order) -> its communicator.
        recorder: called as recorder(kind, axis, send_bytes, input_bytes, cause) for backward traffic.
    """

    def __init__(self, communicator_for: Callable[[Tuple[int, ...]], object], recorder: Optional[Recorder] = None):
        self._communicator_for = communicator_for
        self.recorder = recorder
        self._ops = {}
        self._rings = {}
        self.ring_timings: Deque[RingShiftTiming] = deque(maxlen=RING_TIMINGS_KEPT)  # latest ring_shift_async waits

    def communicator(self, group: AxisGroup):
        return self._communicator_for(tuple(group.ranks))

    def _op(self, kind, group: AxisGroup, *params) -> _Collective:
        """The (reusable) collective of one kind over `group` with `params`."""
        key = (kind, group, params)
        if key not in self._ops:
            self._ops[key] = kind(self, group, *params)
        return self._ops[key]

    @staticmethod
    def _one(members: Sequence[Tensor], group: AxisGroup, name: str) -> Tensor:
        if len(members) != 1 or len(group.local) != 1:
            raise ValueError(f"{name}: a process holds exactly one member of group {group.axis!r} {group.ranks}; "
                             f"got {len(members)} tensors for local members {group.local}")
        return members[0]

    def all_reduce(self, members, op: str, group: AxisGroup) -> List[Tensor]:
        x = self._one(members, group, "all_reduce")
        return [x if group.size == 1 else self._op(_AllReduce, group, op)(x)]

    def all_gather(self, members, dim: int, group: AxisGroup, grad_partial: bool = False) -> List[Tensor]:
        x = self._one(members, group, "all_gather")
        return [x if group.size == 1 else self._op(_AllGather, group, dim, grad_partial)(x)]

    def reduce_scatter(self, members, dim: int, op: str, group: AxisGroup) -> List[Tensor]:
        x = self._one(members, group, "reduce_scatter")
        return [x if group.size == 1 else self._op(_ReduceScatter, group, dim, op)(x)]

    def all_to_all(self, members, split_dim: int, concat_dim: int, group: AxisGroup) -> List[Tensor]:
        x = self._one(members, group, "all_to_all")
        return [x if group.size == 1 else self._op(_AllToAll, group, split_dim, concat_dim)(x)]

    def _ring(self, group: AxisGroup) -> _Ring:
        if group not in self._rings:
            self._rings[group] = _Ring(self, group)
        return self._rings[group]

    def ring_shift_async(self, tensors: Sequence[Tensor], group: AxisGroup, phase: str = "forward") -> RingShiftHandle:
        """Each of this process's `tensors` (e.g. K and V) moves to member i+1 (mod n) of `group`,
        posted to the group's sender thread: returns at once a handle whose `wait()` gives member
        i-1's tensors (plain tensors, no autograd node; see `mindspore_hyper.comm.ring_shift_async`).
        Wait for it before any other collective on `group`.

        Args:
            tensors: this member's tensors (one or more).
            group: the ring (this process holds one member).
            phase: the pass posting it ("forward" / "backward"), kept in its `RingShiftTiming`.

        Raises:
            ValueError: the process holds more than one member, or no tensor is given.
        """
        if len(group.local) != 1 or not tensors:
            raise ValueError(f"ring_shift_async: a process holds exactly one member of group {group.axis!r} "
                             f"{group.ranks} and posts one or more tensors; got {len(tensors)} tensors for local "
                             f"members {group.local}")
        what = f"ring_shift_async over mesh axis {group.axis!r} (global ranks {list(group.ranks)})"
        if group.size == 1:
            return RingShiftHandle(self, tensors, None, what, phase, adopt, None)
        ring = self._ring(group)
        job = ring.sender.post([_array(x) for x in tensors])
        return RingShiftHandle(self, tensors, job, what, phase, adopt, getattr(ring.comm, "abort", None))

    def permute_chunks(self, chunks: Sequence[Tensor], sources: Sequence[int], group: AxisGroup) -> List[Tensor]:
        """Chunks change owners over `group` by point-to-point sends (plain tensors, no autograd
        node: ring attention's zigzag order, whose backward calls it with the inverse order).

        Member i holds chunks i*p .. i*p+p-1 of a global order (p = len(chunks)) and gets chunks
        sources[i*p] .. sources[i*p+p-1]; every chunk has the same shape and dtype, and every
        member passes the same `sources`. Call it with no posted `ring_shift_async` pending.

        Raises:
            ValueError: the process holds more than one member, or `sources` is not a permutation
                of the group's size * p chunks.
        """
        if len(group.local) != 1 or sorted(sources) != list(range(group.size * len(chunks))):
            raise ValueError(f"permute_chunks: a process holds exactly one member of group {group.axis!r} "
                             f"{group.ranks} and sources is a permutation of range({group.size} * {len(chunks)}); "
                             f"got local members {group.local}, sources {list(sources)}")
        if group.size == 1:
            return [chunks[c] for c in sources]
        p, me = len(chunks), group.local[0]
        moved = self._ring(group).permute([_array(x) for x in chunks], sources)
        return [chunks[sources[me * p + j] % p] if a is None else adopt(a, chunks[j]) for j, a in enumerate(moved)]

    def local_slice(self, tensor: Tensor, dim: int, group: AxisGroup, record: bool = True) -> List[Tensor]:
        self._one([tensor], group, "local_slice")
        return [tensor if group.size == 1 else self._op(_LocalSlice, group, dim, record)(tensor)]

    def make_partial(self, tensor: Tensor, op: str, group: AxisGroup) -> List[Tensor]:
        self._one([tensor], group, "make_partial")
        if op != "sum" or group.size == 1:
            return [tensor]
        return [self._op(_MakePartialSum, group)(tensor)]

    def fan_out(self, tensor: Tensor, group: AxisGroup) -> Tensor:
        self._one([tensor], group, "fan_out")
        return tensor if group.size == 1 else self._op(_FanOut, group)(tensor)

    def broadcast(self, members, root: int, group: AxisGroup) -> List[Tensor]:
        x = self._one(members, group, "broadcast")
        return [x if group.size == 1 else self._op(_Broadcast, group, root)(x)]
