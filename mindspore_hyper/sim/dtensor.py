"""DTensor for the simulation: one object holding every virtual device's shard of a tensor.

A DTensor is a `mindspore.Tensor` subclass whose own (lazily initialised, never materialised)
storage only carries the global shape and dtype; the data lives in its shards. MindSpore hands
every op on it to `__fallback__`, which the dispatcher runs per shard by the op's sharding rule.

Shards are stored once per distinct value: keyed by the device's coordinates on the
"significant" mesh axes (those that shard a dimension or are Partial). Devices that differ only
along replicated axes share one shard object.
"""
from __future__ import annotations

import math
import weakref
from typing import Dict, List, Sequence, Tuple

import numpy as np
from mindspore import Tensor
from mindspore.common.initializer import Zero

from mindspore_hyper.context import get_context
from mindspore_hyper.shard.redistribute import (
    AllGather, AllReduce, AllToAll, LocalSlice, MakePartial, ReduceScatter, plan_redistribution,
)
from mindspore_hyper.shard.tensor_layout import TensorLayout
from mindspore_hyper.sim.accounting import active_accounting
from mindspore_hyper.sim.collectives import SimCollectives

__all__ = ["DTensor", "distribute_tensor", "significant_axes"]

Key = Tuple[int, ...]
_MINDSPORE_COLLECTIVES = SimCollectives()


def collectives() -> SimCollectives:
    """The collectives backend chosen by the `sim_collectives` context flag."""
    if get_context("sim_collectives") == "library":
        from mindspore_hyper.sim.library_collectives import LibraryCollectives

        return LibraryCollectives()
    return _MINDSPORE_COLLECTIVES


def significant_axes(layout: TensorLayout) -> Tuple[int, ...]:
    """Mesh axes along which shards differ: sharding axes and Partial axes, ascending."""
    return tuple(sorted(set(layout.sharded_axes()) | set(layout.partial)))


def key_of(coords: Sequence[int], axes: Sequence[int]) -> Key:
    return tuple(coords[a] for a in axes)


class DTensor(Tensor):
    """A tensor laid out over a simulated mesh (see module docstring). Build with
    `distribute_tensor` or receive from ops on DTensors."""

    @staticmethod
    def _create(layout: TensorLayout, shards: Dict[Key, Tensor], global_shape: Sequence[int], dtype) -> "DTensor":
        global_shape = tuple(int(s) for s in global_shape)
        placeholder = Tensor(shape=global_shape, dtype=dtype, init=Zero())
        dt = Tensor._make_subclass(DTensor, placeholder)
        dt._layout = layout
        dt._shards = shards
        dt._global_shape = global_shape
        nbytes = math.prod(layout.local_shape(global_shape)) * dtype.itemsize
        dt._local_nbytes = nbytes
        dt._parameter_id = None  # id of the Parameter this DTensor lays out, if any
        accounting = active_accounting()
        accounting.allocate(nbytes)
        weakref.finalize(dt, accounting.free, nbytes)
        return dt

    # -- views -------------------------------------------------------------------------------
    @property
    def layout(self) -> TensorLayout:
        return self._layout

    @property
    def shards(self) -> Dict[Key, Tensor]:
        """The distinct shards keyed by coordinates on `significant_axes(layout)`."""
        return self._shards

    @property
    def global_shape(self) -> Tuple[int, ...]:
        return self._global_shape

    @property
    def local_nbytes(self) -> int:
        """Bytes of one device's shard."""
        return self._local_nbytes

    def local_shard(self, rank: int) -> Tensor:
        """Virtual device `rank`'s shard (a plain Tensor)."""
        coords = self._layout.mesh.coords(rank)
        return self._shards[key_of(coords, significant_axes(self._layout))]

    def full_tensor(self) -> Tensor:
        """The global tensor as a plain Tensor (differentiable: gathers and reduces as needed)."""
        replicated = TensorLayout.replicated(self._layout.mesh, len(self._global_shape))
        return self.redistribute(replicated)._shards[()]

    def redistribute(self, layout: TensorLayout, *, account_backward: bool = True) -> "DTensor":
        """Execute the planner's steps with simulated collectives; returns a new DTensor.

        `account_backward=False` skips the backward conjugates in the accounting (used when a
        global tensor is first laid out: in a real run it arrives already sharded)."""
        if layout == self._layout:
            return self
        plan = plan_redistribution(self._layout, layout, self._global_shape, self.dtype.itemsize)
        shards, current = self._shards, self._layout
        accounting = active_accounting()
        itemsize = self.dtype.itemsize
        for step in plan:
            input_bytes = math.prod(current.local_shape(self._global_shape)) * itemsize
            shards, current = _apply_step(step, shards, current)
            axis = current.mesh.alias_names[step.axis]
            if not isinstance(step, (LocalSlice, MakePartial)):
                accounting.record_comm(type(step).__name__, axis, step.send_bytes, input_bytes)
            if account_backward and _is_float(self.dtype):
                _record_backward_conjugate(accounting, step, axis, input_bytes, current)
        return DTensor._create(layout, shards, self._global_shape, self.dtype)

    def asnumpy(self) -> np.ndarray:
        return self.full_tensor().asnumpy()

    def __getitem__(self, index):
        from mindspore_hyper.sim.dispatch import dispatch_getitem

        return dispatch_getitem(self, index)

    def __setitem__(self, index, value):
        raise TypeError("in-place item assignment on a simulated DTensor is not supported; "
                        "build the new tensor with ops (e.g. ops.masked_fill / ops.select)")

    def __fallback__(self, func, args, kwargs=None):
        from mindspore_hyper.sim.dispatch import dispatch

        return dispatch(func, args, kwargs or {})

    def __repr__(self) -> str:
        local = self._layout.local_shape(self._global_shape)
        return (f"DTensor(shape={self._global_shape}, dtype={self.dtype}, layout={self._layout.tensor_map}"
                f"{', partial=' + repr(self._layout.partial) if self._layout.is_partial else ''}, "
                f"mesh={dict(zip(self._layout.mesh.alias_names, self._layout.mesh.device_matrix))}, "
                f"shard_shape={local}, distinct_shards={len(self._shards)})")

    __str__ = __repr__


def distribute_tensor(tensor: Tensor, layout: TensorLayout) -> DTensor:
    """Lay a global tensor out by `layout` (differentiable slicing; Partial axes get the value on
    coordinate 0, zeros elsewhere for sum, copies for avg/max/min).

    Raises:
        ValueError: the shape does not divide by the layout.
    """
    if isinstance(tensor, DTensor):
        return tensor.redistribute(layout)
    global_shape = tuple(tensor.shape)
    layout.check_shape(global_shape)
    replicated = TensorLayout.replicated(layout.mesh, len(global_shape))
    source = DTensor._create(replicated, {(): tensor}, global_shape, tensor.dtype)
    return source.redistribute(layout, account_backward=False)  # local slicing only


def _is_float(dtype) -> bool:
    import mindspore as ms

    return dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16)


def _record_backward_conjugate(accounting, step, axis: str, input_bytes: int, after: TensorLayout) -> None:
    """The gradient of a forward redistribution step moves the other way."""
    n = after.mesh.device_matrix[step.axis]
    if isinstance(step, AllGather):  # grads of the gathered tensor are reduce-scattered back
        accounting.record_comm("ReduceScatter", axis, step.send_bytes, input_bytes * n, backward=True)
    elif isinstance(step, ReduceScatter):
        accounting.record_comm("AllGather", axis, step.send_bytes, input_bytes // n, backward=True)
    elif isinstance(step, AllToAll):
        accounting.record_comm("AllToAll", axis, step.send_bytes, input_bytes, backward=True)
    elif isinstance(step, LocalSlice):  # the slices' grads are gathered into the replica's grad
        accounting.record_comm("AllGather", axis, (n - 1) * input_bytes // n, input_bytes // n, backward=True)


def _apply_step(step, shards: Dict[Key, Tensor], layout: TensorLayout):
    """One plan step on the distinct shards; returns (new shards, new layout)."""
    mesh = layout.mesh
    a = step.axis
    n = mesh.device_matrix[a]
    old_axes = significant_axes(layout)
    dims = [list(e) for e in layout.dims]
    partial = layout.partial
    if isinstance(step, LocalSlice):
        dims[step.dim].append(a)
    elif isinstance(step, AllGather):
        dims[step.dim].remove(a)
    elif isinstance(step, AllToAll):
        dims[step.concat_dim].remove(a)
        dims[step.split_dim].append(a)
    elif isinstance(step, ReduceScatter):
        del partial[a]
        dims[step.dim].append(a)
    elif isinstance(step, AllReduce):
        del partial[a]
    elif isinstance(step, MakePartial):
        partial[a] = step.op
    new_layout = TensorLayout.from_dims(mesh, dims, partial)
    new_axes = significant_axes(new_layout)
    new_shards: Dict[Key, Tensor] = {}
    backend = collectives()
    if a not in old_axes:  # LocalSlice / MakePartial: one old shard -> n new ones
        for key, shard in shards.items():
            if isinstance(step, LocalSlice):
                parts = backend.local_slice(shard, n, step.dim)
            else:
                parts = backend.make_partial(shard, n, step.op)
            old = dict(zip(old_axes, key))
            for c, part in enumerate(parts):
                old[a] = c
                new_shards[tuple(old[x] for x in new_axes)] = part
        return new_shards, new_layout
    position = old_axes.index(a)
    groups: Dict[Key, List[Tensor]] = {}
    for key, shard in sorted(shards.items()):
        rest = key[:position] + key[position + 1:]
        groups.setdefault(rest, [None] * n)[key[position]] = shard
    for rest, members in groups.items():
        if isinstance(step, AllGather):
            outs = backend.all_gather(members, step.dim)
        elif isinstance(step, AllToAll):
            outs = backend.all_to_all(members, step.split_dim, step.concat_dim)
        elif isinstance(step, ReduceScatter):
            outs = backend.reduce_scatter(members, step.dim, step.op)
        else:
            outs = backend.all_reduce(members, step.op)
        for c, out in enumerate(outs):
            coords = dict(zip([x for x in old_axes if x != a], rest))
            coords[a] = c
            new_key = tuple(coords[x] for x in new_axes)
            new_shards[new_key] = out
    return new_shards, new_layout
