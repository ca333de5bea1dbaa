"""DTensor: a tensor laid out over a mesh, holding the shards of the ranks its process owns.

A DTensor is a `mindspore.Tensor` subclass whose own (lazily initialised, never materialised)
storage only carries the global shape and dtype; the data lives in its shards. MindSpore hands
every op on it to `__fallback__`, which its `Execution` dispatches per shard by the op's sharding
rule. In simulation the process owns every virtual device; under msrun one.

Shards are stored once per distinct value: keyed by the device's coordinates on the
"significant" mesh axes (those that shard a dimension or are Partial). Devices that differ only
along replicated axes share one shard object.

Reading values (`asnumpy`, `item`, `tolist`, `float`, `int`, `bool`, `Tensor(d)`) gathers the
global tensor first; under msrun that is a collective every process must call.
"""
from __future__ import annotations

import math
import weakref
from typing import Dict, Sequence, Tuple

import numpy as np
from mindspore import Tensor, ops
from mindspore.common.initializer import Zero

from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["DTensor", "significant_axes", "key_of", "is_float"]

Key = Tuple[int, ...]


def significant_axes(layout: TensorLayout) -> Tuple[int, ...]:
    """Mesh axes along which shards differ: sharding axes and Partial axes, ascending."""
    return tuple(sorted(set(layout.sharded_axes()) | set(layout.partial)))


def key_of(coords, axes: Sequence[int]) -> Key:
    return tuple(coords[a] for a in axes)


def is_float(dtype) -> bool:
    import mindspore as ms

    return dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16)


class DTensor(Tensor):
    """A tensor laid out over a mesh (see module docstring). Build with `distribute_tensor`
    or receive from ops on DTensors."""

    @staticmethod
    def _create(layout: TensorLayout, shards: Dict[Key, Tensor], global_shape: Sequence[int], dtype,
                execution) -> "DTensor":
        global_shape = tuple(int(s) for s in global_shape)
        placeholder = Tensor(shape=global_shape, dtype=dtype, init=Zero())
        dt = Tensor._make_subclass(DTensor, placeholder)
        dt._layout = layout
        dt._shards = shards  # None until `_pending()` makes them (a lazily laid out Parameter)
        dt._pending = None
        dt._stacked = None  # the shards stacked along a new leading dimension, when made so (`batched`)
        dt._hint_source = None  # a DTensor this one is a not yet moved `.shard()` view of
        dt._global_shape = global_shape
        dt._execution = execution
        nbytes = math.prod(layout.local_shape(global_shape)) * dtype.itemsize
        dt._parameter_id = None  # id of the Parameter this DTensor lays out, if any
        accounting = execution.accounting
        if execution.holds_activations:
            accounting.hold(nbytes)
        else:
            accounting.allocate(nbytes)
            weakref.finalize(dt, accounting.free, nbytes)
        return dt

    # -- views -------------------------------------------------------------------------------
    @property
    def layout(self) -> TensorLayout:
        return self._layout

    @classmethod
    def _lazy(cls, layout: TensorLayout, make_shards, global_shape: Sequence[int], dtype, execution) -> "DTensor":
        """A DTensor whose shards `make_shards()` computes on first use (a Parameter laid out
        when an op first reads it, so hooks that fill it just before its Cell runs compose)."""
        dt = cls._create(layout, None, global_shape, dtype, execution)
        dt._pending = make_shards
        return dt

    @classmethod
    def _from_stack(cls, layout: TensorLayout, stacked: Tensor, keys: Sequence[Key], global_shape: Sequence[int],
                    dtype, execution) -> "DTensor":
        """A DTensor whose distinct shards are `stacked[i]` for `keys[i]`, cut out only when read
        (a batched op's result; the next batched op reads `stacked` itself)."""
        dt = cls._lazy(layout, lambda: dict(zip(keys, ops.unstack(stacked, 0))), global_shape, dtype, execution)
        dt._stacked = stacked
        return dt

    @property
    def shards(self) -> Dict[Key, Tensor]:
        """The distinct shards this process holds, keyed by coordinates on `significant_axes(layout)`."""
        if self._pending is not None:
            make, self._pending = self._pending, None
            self._shards = make()
        return self._shards

    @property
    def global_shape(self) -> Tuple[int, ...]:
        return self._global_shape

    @property
    def execution(self):
        """The run this DTensor belongs to (mesh, held ranks, collectives, accounting)."""
        return self._execution

    def local_shard(self, rank: int) -> Tensor:
        """Device `rank`'s shard (a plain Tensor).

        Raises:
            ValueError: this process does not hold `rank`.
        """
        if rank not in self._execution.local_ranks:
            raise ValueError(f"rank {rank} is not held by this process (it holds {self._execution.local_ranks})")
        coords = self._layout.mesh.coords(rank)
        return self.shards[key_of(coords, significant_axes(self._layout))]

    def full_tensor(self) -> Tensor:
        """The global tensor as a plain Tensor (differentiable: gathers and reduces as needed)."""
        replicated = TensorLayout.replicated(self._layout.mesh, len(self._global_shape))
        return self.redistribute(replicated).shards[()]

    def redistribute(self, layout: TensorLayout, *, record: bool = True, grad_partial_axes=()) -> "DTensor":
        """Execute the planner's steps with the run's collectives; returns a new DTensor.

        Args:
            layout: the wanted layout.
            record: account the steps (False when a global tensor is first laid out: a real run
                starts with the shards, so neither pass moves anything).
            grad_partial_axes: mesh axes over which the result's consumers hold partial gradients
                (an op sharded over them reads the result replicated): gathers along them
                reduce-scatter in backward.
        """
        return self.redistribute_with_fusion(layout, record=record, grad_partial_axes=grad_partial_axes)[0]

    def redistribute_with_fusion(self, layout: TensorLayout, *, record: bool = True, grad_partial_axes=()):
        """`redistribute`, also returning the `grad_partial_axes` whose gathers took over the
        backward gradient sum (the caller need not fan out along them)."""
        if layout == self._layout:
            return self, set()
        return self._execution.redistribute(self, layout, record, grad_partial_axes)

    # -- values ------------------------------------------------------------------------------
    def asnumpy(self) -> np.ndarray:
        return self.full_tensor().asnumpy()

    def numpy(self) -> np.ndarray:
        return self.asnumpy()

    def __array__(self, dtype=None):
        array = self.asnumpy()
        return array if dtype is None else array.astype(dtype)

    def item(self, *index):
        return self.full_tensor().item(*index)

    def tolist(self):
        return self.full_tensor().tolist()

    def __float__(self) -> float:
        return float(self.full_tensor())

    def __int__(self) -> int:
        return int(self.full_tensor())

    def __index__(self) -> int:
        if is_float(self.dtype):
            raise TypeError(f"a {self.dtype} DTensor cannot be used as an index")
        return int(self.full_tensor())

    def __bool__(self) -> bool:
        return bool(self.full_tensor())

    # -- copies and storage ------------------------------------------------------------------
    def __new__(cls, *args, **kwargs):
        # Reached only by callers that build a new object from a DTensor's storage, such as
        # `Parameter(d)` (DTensors themselves are made by `Tensor._make_subclass`).
        raise TypeError("a DTensor cannot be the data of a new Parameter or Tensor subclass; pass "
                        "d.full_tensor() (the global value) or d.local_shard(rank) (one device's shard)")

    def __deepcopy__(self, memo) -> "DTensor":
        """A DTensor with the same layout and copies of the shards (same run)."""
        copied = DTensor._create(self._layout, {k: ops.deepcopy(v) for k, v in self.shards.items()},
                                 self._global_shape, self.dtype, self._execution)
        memo[id(self)] = copied
        return copied

    def __reduce_ex__(self, protocol):
        """Pickles as a plain Tensor of the global value (a run's mesh and collectives do not
        travel)."""
        return Tensor, (self.asnumpy(),)

    def __copy__(self) -> "DTensor":
        return DTensor._create(self._layout, dict(self.shards), self._global_shape, self.dtype, self._execution)

    @property
    def data(self) -> "DTensor":
        """This DTensor (MindSpore's `Tensor.data` would read the placeholder)."""
        return self

    @data.setter
    def data(self, value) -> None:
        """Replace the values (laid out by this DTensor's layout), like `Tensor.data = value`;
        a DTensor laying out a model Parameter writes the Parameter too.

        Raises:
            ValueError: `value`'s shape differs from this DTensor's global shape.
        """
        if tuple(value.shape) != self._global_shape:
            raise ValueError(f"DTensor.data = value: value has shape {tuple(value.shape)}, expected {self._global_shape}")
        self._execution.set_data(self, value)

    # -- indexing ----------------------------------------------------------------------------
    def __getitem__(self, index):
        return self._execution.getitem(self, index)

    def __setitem__(self, index, value):
        self._execution.setitem(self, index, value)

    def __fallback__(self, func, args, kwargs=None):
        return self._execution.dispatch(func, args, kwargs or {})

    def _become(self, other: "DTensor") -> "DTensor":
        """Take `other`'s layout and shards (the result of an in-place op on this DTensor)."""
        self._layout, self._shards = other._layout, other.shards
        self._pending, self._stacked = None, other._stacked
        return self

    # -- operators with a plain Tensor on the left ---------------------------------------------
    # Python tries a subclass's reflected method first; MindSpore's own operator would not find
    # this DTensor's __fallback__ when the left operand is a plain Tensor.
    def __radd__(self, other):
        return ops.add(other, self)

    def __rsub__(self, other):
        return ops.sub(other, self)

    def __rmul__(self, other):
        return ops.mul(other, self)

    def __rtruediv__(self, other):
        return ops.div(other, self)

    def __rfloordiv__(self, other):
        return ops.floor_div(other, self)

    def __rmod__(self, other):
        return ops.floor_mod(other, self)

    def __rpow__(self, other):
        return ops.pow(other, self)

    def __rmatmul__(self, other):
        return ops.matmul(other, self)

    def __rand__(self, other):
        return ops.logical_and(other, self) if self.dtype == _bool() else ops.bitwise_and(other, self)

    def __ror__(self, other):
        return ops.logical_or(other, self) if self.dtype == _bool() else ops.bitwise_or(other, self)

    def __rxor__(self, other):
        return ops.logical_xor(other, self) if self.dtype == _bool() else ops.bitwise_xor(other, self)

    def __lt__(self, other):
        return ops.less(self, other)

    def __le__(self, other):
        return ops.less_equal(self, other)

    def __gt__(self, other):
        return ops.greater(self, other)

    def __ge__(self, other):
        return ops.greater_equal(self, other)

    def __eq__(self, other):
        return False if other is None else ops.equal(self, other)

    def __ne__(self, other):
        return True if other is None else ops.not_equal(self, other)

    __hash__ = Tensor.__hash__

    def __repr__(self) -> str:
        local = self._layout.local_shape(self._global_shape)
        return (f"DTensor(shape={self._global_shape}, dtype={self.dtype}, layout={self._layout.tensor_map}"
                f"{', partial=' + repr(self._layout.partial) if self._layout.is_partial else ''}, "
                f"mesh={dict(zip(self._layout.mesh.alias_names, self._layout.mesh.device_matrix))}, "
                f"shard_shape={local}, distinct_shards={len(self.shards)})")

    __str__ = __repr__


def _bool():
    import mindspore as ms

    return ms.bool_
