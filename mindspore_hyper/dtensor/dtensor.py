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
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor, ops
from mindspore.common import dtype as mstype
from mindspore.common.initializer import Zero

from mindspore_hyper import bfloat16_emulation
from mindspore_hyper.dtensor.reflected_operators import ReflectedOperators
from mindspore_hyper.shard.placement import Replicate
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["DTensor", "significant_axes", "key_of", "is_float", "to_local", "from_local", "layout_on",
           "accept_layout_form"]

Key = Tuple[int, ...]


def _shard_bytes(layout: TensorLayout, global_shape, dtype) -> Tuple[bool, int]:
    """(whether the layout splits `global_shape` into uneven torch.chunk pieces, bytes of one
    device's shard): with uneven pieces the largest device's (coordinate 0's); such DTensors run
    ops per shard (their shards do not stack)."""
    if layout.is_even(global_shape):
        return False, math.prod(layout.local_shape(global_shape)) * dtype.itemsize
    return True, math.prod(layout.max_local_shape(global_shape)) * dtype.itemsize


def significant_axes(layout: TensorLayout) -> Tuple[int, ...]:
    """Mesh axes along which shards differ: sharding axes and Partial axes, ascending."""
    return layout.significant_axes


def key_of(coords, axes: Sequence[int]) -> Key:
    return tuple(coords[a] for a in axes)


_FLOAT_DTYPES = (mstype.float16, mstype.float32, mstype.float64, mstype.bfloat16)
# id(dtype) -> (dtype, is float): MindSpore's dtype comparison costs microseconds and the
# dispatcher asks per input of every op; the entry keeps its dtype alive, so its id is not reused
_IS_FLOAT: Dict[int, Tuple[object, bool]] = {}


def is_float(dtype) -> bool:
    entry = _IS_FLOAT.get(id(dtype))
    if entry is None or entry[0] is not dtype:
        entry = (dtype, dtype in _FLOAT_DTYPES)
        if len(_IS_FLOAT) < 64:  # MindSpore's dtypes are a few singletons; others are answered, not kept
            _IS_FLOAT[id(dtype)] = entry
    return entry[1]


class DTensor(ReflectedOperators, Tensor):
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
        dt._uneven, nbytes = _shard_bytes(layout, global_shape, dtype)
        dt._parameter_id = None  # id of the Parameter this DTensor lays out, if any
        dt._cast_of = None  # id of the Parameter this DTensor is a dtype cast of (named in collective causes)
        dt._cast_exact = False  # a cast of that Parameter's own value (not of a rounded copy of it)
        dt._gradient_to = None  # a DTensor each device's read of this one sends its gradient to (dispatch.py)
        dt._device_mesh = None  # the mesh view it was made on (a DeviceMesh); None: its layout's mesh
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
        def unstack():
            with bfloat16_emulation.outside_cells():  # in a BF16 Cell: float32 shards stay float32 (no
                return dict(zip(keys, ops.unstack(stacked, 0)))  # bfloat16 Stack in the backward)

        dt = cls._lazy(layout, unstack, global_shape, dtype, execution)
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

    def reduce_partial(self) -> "DTensor":
        """Upstream's `reduce_partial()`: every Partial placement reduced (by its op) into
        Replicate, Shard and Replicate placements kept, on the same mesh (differentiable). A
        DTensor without Partial placements is returned as it is.

        Raises:
            ValueError: a rank-local value (it has no global value to reduce into).
        """
        if not self._layout.is_partial:
            return self
        if self._layout.is_rank_local:
            raise ValueError("DTensor.reduce_partial(): a rank-local value (from to_local() in simulation) has no "
                             "global value; make it a DTensor with DTensor.from_local first")
        reduced = self.redistribute(self._layout.with_partial({}))
        reduced._device_mesh = self._device_mesh
        return reduced

    @property
    def device_mesh(self):
        """The mesh this DTensor lives on: the DeviceMesh (or sub-mesh) it was made on, else its
        layout's mesh."""
        return self._device_mesh if self._device_mesh is not None else self._layout.mesh

    @property
    def placements(self) -> tuple:
        """One placement per dimension of `device_mesh` (Shard, Replicate or Partial)."""
        mesh = self.device_mesh
        return mesh.placements_of(self._layout) if hasattr(mesh, "placements_of") else self._layout.placements

    def to_local(self) -> Tensor:
        """This process's part: under msrun the rank's shard (a plain Tensor); in simulation the
        shard when every rank holds the same one, else a rank-local value (`dtensor.rank_local`)."""
        return to_local(self)

    @staticmethod
    def from_local(local_tensor, device_mesh, placements=None, *, run_check: bool = False, shape=None,
                   stride=None) -> "DTensor":
        """The DTensor whose shard on each rank is that rank's `local_tensor` (see
        module function `from_local`; `device_mesh` may be upstream's Layout call result)."""
        return from_local(local_tensor, device_mesh, placements, run_check=run_check, shape=shape, stride=stride)

    def redistribute(self, layout=None, placements=None, *, record: bool = True, grad_partial_axes=(),
                     async_op: bool = False) -> "DTensor":
        """Execute the planner's steps with the run's collectives; returns a new DTensor.

        Args:
            layout: the wanted TensorLayout, or a device mesh (HyperParallel's
                `redistribute(device_mesh, placements)`; None: this DTensor's mesh). A
                DeviceMesh of another shape, names or rank order over the same devices is
                reached through Replicate (`_across_meshes`), as upstream allows. Upstream's
                Layout call result on another Layout than this DTensor's mesh is taken as that
                Layout's DeviceMesh and tensor map (`accept_layout_form`).
            placements: with a device mesh: one placement per mesh dimension (required for
                another mesh; None: this DTensor's placements on its own).
            async_op: accepted for HyperParallel's signature; the move completes before return.
            record: account the steps (False when a global tensor is first laid out: a real run
                starts with the shards, so neither pass moves anything).
            grad_partial_axes: mesh axes over which the result's consumers hold partial gradients
                (an op sharded over them reads the result replicated): gathers along them
                reduce-scatter in backward.

        Raises:
            ValueError: a mesh on other devices, another mesh without placements, a
                rank-local value, or a TensorLayout on another mesh (the planner's).
        """
        if (placements is None and isinstance(layout, TensorLayout) and layout.mesh != self._layout.mesh
                and _LAYOUT_FORM):  # upstream's Layout call result on another mesh of the same devices
            layout, placements = _LAYOUT_FORM[0](layout, self.ndim, "DTensor.redistribute")
        if placements is not None or not isinstance(layout, TensorLayout):
            mesh = layout if layout is not None else self.device_mesh
            _check_same_devices(self, mesh)
            if hasattr(mesh, "execution") and mesh.root != self._layout.mesh:
                if placements is None:
                    raise ValueError(f"redistribute(device_mesh={mesh!r}): another mesh than this DTensor's; pass "
                                     f"placements=, one per dimension of it {mesh.mesh_dim_names}")
                moved = _across_meshes(self, mesh, placements, record)
                moved._device_mesh = mesh
                return moved
            placements = self.placements if placements is None else placements
            target = layout_on(mesh, placements, self.ndim, base=self._layout)
            moved = self.redistribute_with_fusion(target, record=record)[0]
            if moved is self:
                return self
            moved._device_mesh = mesh if hasattr(mesh, "placements_of") else None
            return moved
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
        # `Parameter(d)` gets its run's laid-out Parameter (`Execution.parameter_from`); other callers
        # that build on a DTensor's storage are refused (DTensors are made by `Tensor._make_subclass`).
        if issubclass(cls, Parameter) and args and isinstance(args[0], DTensor):
            return args[0].execution.parameter_from(args[0])
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
        if SKIP_DISPATCH and getattr(func, "name", None) not in SKIP_DISPATCH[-1]:
            args = _locals(args)
            kwargs = {k: _locals((v,))[0] for k, v in (kwargs or {}).items()}
        result = self._execution.dispatch(func, args, kwargs or {})
        if self._device_mesh is not None:
            _keep_mesh(result, self._device_mesh)
        return result

    def _become(self, other: "DTensor") -> "DTensor":
        """Take `other`'s layout and shards (the result of an in-place op on this DTensor)."""
        self._layout, self._shards = other._layout, other.shards
        self._pending, self._stacked = None, other._stacked
        return self

    # Defining __eq__ (in ReflectedOperators) makes a class unhashable: keep Tensor's hash.
    __hash__ = Tensor.__hash__

    def __repr__(self) -> str:
        local = self._layout.max_local_shape(self._global_shape)
        return (f"DTensor(shape={self._global_shape}, dtype={self.dtype}, layout={self._layout.tensor_map}"
                f"{', partial=' + repr(self._layout.partial) if self._layout.is_partial else ''}, "
                f"mesh={dict(zip(self._layout.mesh.alias_names, self._layout.mesh.device_matrix))}, "
                f"shard_shape={local}, distinct_shards={len(self.shards)})")

    __str__ = __repr__


# Op names still dispatched on DTensors, one set per open `SkipDTensorDispatch` block
# (hyper_parallel API): inside one, every other op runs on the operands' local parts.
SKIP_DISPATCH: list = []


def _locals(values):
    out = []
    for v in values:
        if isinstance(v, DTensor) and not v.layout.is_rank_local:
            out.append(v.to_local())
        elif isinstance(v, (list, tuple)) and any(isinstance(x, DTensor) for x in v):
            out.append(type(v)(_locals(v)))
        else:
            out.append(v)
    return tuple(out)


def _keep_mesh(result, mesh) -> None:
    """Results of an op on a DTensor made on a (sub-)mesh stay on it when their layout uses only
    that mesh's dimensions."""
    for value in result if isinstance(result, (tuple, list)) else (result,):
        if isinstance(value, DTensor) and value._device_mesh is None and mesh.holds(value._layout):
            value._device_mesh = mesh


# -- HyperParallel/torch's local views: to_local, from_local ---------------------------------------

def _check_same_devices(dt: "DTensor", mesh) -> None:
    """Raise unless the DeviceMesh `mesh` (a plain Layout passes) lies on `dt`'s devices.

    Raises:
        ValueError: `mesh` holds other ranks of the job (moving between device sets is not supported).
    """
    if hasattr(mesh, "execution") and mesh.execution().job_ranks != dt.execution.job_ranks:
        raise ValueError(f"redistribute to {mesh!r}: it lies on other devices than this DTensor's mesh (the job's "
                         f"ranks {mesh.execution().job_ranks} vs {dt.execution.job_ranks}); moving a DTensor between "
                         "device sets is not supported (upstream requires the same rank list too): take its value "
                         "with .full_tensor() (or .redistribute(its_mesh, [Replicate(), ...]).to_local()) and build "
                         "the DTensor on the new mesh with distribute_tensor / DTensor.from_local")


def _across_meshes(dt: "DTensor", mesh, placements, record: bool) -> "DTensor":
    """`dt` on the DeviceMesh `mesh`, another mesh (shape, names or rank order) over the same
    devices (upstream's `redistribute` onto a mesh of another shape): gathered to Replicate on
    its own mesh (the collectives that takes: AllGather of shards, AllReduce of Partial values,
    accounted there), the same global value taken as Replicate on `mesh` (every device already
    holds it: no communication), then laid out as `placements` there (local slices). Exact, and
    differentiable through the same steps: the slices' backward gathers the gradient, the
    gathers' backward slices it (or reduces it where the source was Partial)."""
    replicated = dt.redistribute(TensorLayout.replicated(dt.layout.mesh, dt.ndim), record=record)
    execution = mesh.execution()
    whole = TensorLayout.replicated(mesh.root, dt.ndim)
    on_mesh = DTensor._create(whole, {(): replicated.shards[()]}, dt.global_shape, dt.dtype, execution)
    return on_mesh.redistribute_with_fusion(layout_on(mesh, placements, dt.ndim), record=record)[0]


def layout_on(mesh, placements, ndim: int, base: Optional[TensorLayout] = None) -> TensorLayout:
    """The TensorLayout of `placements` on `mesh`: a DeviceMesh view (which maps its own dims onto
    its root mesh; the root's other dims keep `base`'s placements, else Replicate) or a plain
    Layout (one placement per axis)."""
    if hasattr(mesh, "tensor_layout"):
        return mesh.tensor_layout(placements, ndim, base=base)
    return TensorLayout.from_placements(mesh, tuple(placements), ndim)


def to_local(dt: "DTensor"):
    """`dt.to_local()`: the shard when this process's ranks all hold the same one (always under
    msrun), else a rank-local DTensor of the shards (no copy)."""
    axes, execution = significant_axes(dt.layout), dt.execution
    if axes and len(execution.local_ranks) == 1 and not execution.shape_only:
        return dt.shards[key_of(execution.mesh.coords(execution.local_ranks[0]), axes)]
    return rank_local_view(dt)


def rank_local_view(dt: "DTensor"):
    """The local part as a parallel style's `use_local_output` gives it: the shard when every
    rank holds the same one, else a rank-local DTensor of the shards (no copy) in every mode --
    under msrun too (one shard), so the model's ops on it are dispatched and accounted there as
    in simulation and in a dry run (which holds one representative rank), and a process's step
    memory series equals a simulated device's."""
    axes = significant_axes(dt.layout)
    execution = dt.execution
    if not axes:
        return dt.shards[()]
    layout = TensorLayout.rank_local(execution.mesh, dt.ndim, axes)
    local_shape = dt.layout.max_local_shape(dt.global_shape)  # uneven shards: each rank's own is its shard's
    out = DTensor._create(layout, dict(dt.shards), local_shape, dt.dtype, execution)
    out._uneven = dt._uneven
    out._device_mesh = dt._device_mesh
    return out


_LAYOUT_FORM: list = []  # the HyperParallel API's converter of a Layout call result (hyper_parallel/layout_form.py)


def accept_layout_form(convert) -> None:
    """Let `from_local` and `redistribute` take upstream's Layout call result in place of a mesh
    and placements: `convert(tensor_layout, ndim, caller)` returns (DeviceMesh, placements) or
    raises naming the field it cannot express. The HyperParallel API registers it (the
    DeviceMesh lives above this layer)."""
    _LAYOUT_FORM[:] = [convert]


def from_local(local, device_mesh, placements=None, *, run_check: bool = False, shape=None,
               stride=None) -> "DTensor":
    """The DTensor whose shard on each rank is that rank's `local` value.

    A plain tensor is the same value on every rank (so `Shard` placements repeat it and a
    `Partial("sum")` is N times it, as N devices passing the same tensor would get); a
    rank-local value (from `to_local()` in simulation) gives each rank its own.

    Args:
        local: a Tensor or a rank-local DTensor.
        device_mesh: a DeviceMesh (or sub-mesh): it knows the run its DTensors belong to; or
            upstream's Layout call result (`Layout((2, 2), ("dp", "tp"))("None", "tp")`, no
            placements): its mesh and tensor map, taken exactly (hyper_parallel/layout_form.py).
        placements: one per mesh dimension (None: Replicate on every one, as torch's default;
            must be None with a Layout call result).
        run_check: check that ranks along Replicate dimensions hold equal values (in simulation
            they do by construction; a rank-local value varying there is refused either way).
        shape: the global shape; None: the local shape times the shard counts (even shards).
            Given, each rank's local shape must be its torch.chunk piece of it (uneven shards:
            the trailing ranks hold fewer rows or none); checked on the ranks this process holds,
            and with `run_check` under msrun on every rank (each process then raises).
        stride: accepted for the signature; must be None or the contiguous strides of `shape`.

    Raises:
        ValueError: a DTensor that is not rank-local, a rank-local value that differs along a
            dimension `placements` replicate, or a `shape`/`stride` the local shards cannot give
            (named with the rank, its local shape and the expected one).
    """
    mesh = device_mesh
    if isinstance(mesh, TensorLayout):
        if placements is not None:
            raise ValueError(f"DTensor.from_local: device_mesh is a Layout call result ({mesh}), which carries the "
                             f"placements itself, and placements={placements!r} was given too; pass one of them")
        if not _LAYOUT_FORM:
            raise TypeError("DTensor.from_local(local, layout): a Layout call result needs the HyperParallel API; "
                            "import mindspore_hyper.hyper_parallel (or hyper_parallel) first")
        mesh, placements = _LAYOUT_FORM[0](mesh, local.ndim, "DTensor.from_local")
    if not hasattr(mesh, "execution"):
        hint = (" (a Layout: call it with the tensor map, e.g. layout('None', 'tp'))"
                if hasattr(mesh, "device_matrix") else "")
        raise TypeError(f"DTensor.from_local: device_mesh must be a DeviceMesh (init_device_mesh) or a Layout call "
                        f"result, got {type(mesh).__name__}{hint}")
    if placements is None:
        placements = (Replicate(),) * mesh.ndim
    root = mesh.root
    if isinstance(local, DTensor) and not local.layout.is_rank_local:
        raise ValueError("DTensor.from_local: local_tensor is already a DTensor (laid out as "
                         f"{local.layout}); use its .redistribute(device_mesh, placements)")
    ndim = local.ndim
    layout = layout_on(mesh, placements, ndim)
    local_shape = tuple(local.shape)
    if shape is None:  # torch's rule: even shards, the global shape is the local one times the shard counts
        global_shape = tuple(n * layout.shard_count(d) for d, n in enumerate(local_shape))
    else:
        global_shape = tuple(int(n) for n in shape)
        if len(global_shape) != ndim:
            raise ValueError(f"DTensor.from_local: shape={tuple(shape)} has {len(global_shape)} dimensions, the local "
                             f"tensor {ndim}")
    if stride is not None and tuple(stride) != _contiguous_strides(global_shape):
        raise ValueError(f"DTensor.from_local: stride={tuple(stride)} is not the contiguous stride "
                         f"{_contiguous_strides(global_shape)} of {global_shape}")
    execution = local.execution if isinstance(local, DTensor) else mesh.execution()
    axes = significant_axes(layout)
    keys = execution.keys(axes)
    if isinstance(local, DTensor):
        source_axes = significant_axes(local.layout)
        extra = [a for a in source_axes if a not in axes]
        if extra:
            names = ", ".join(repr(root.alias_names[a]) for a in extra)
            raise ValueError(f"DTensor.from_local: the local values differ along mesh dimension {names}, but "
                             f"placements {tuple(placements)} replicate it there; shard or make it Partial there")
        shards = {key: local.shards[key_of(dict(zip(axes, key)), source_axes)] for key in keys}
    else:
        shards = {key: local for key in keys}
        if run_check and len(execution.local_ranks) == 1:
            _check_replicas(execution, local, axes)
    if shape is not None:
        _check_local_shapes(execution, layout, shards, axes, global_shape, tuple(placements), run_check)
    out = DTensor._create(layout, shards, global_shape, local.dtype, execution)
    out._device_mesh = mesh if hasattr(mesh, "placements_of") else None
    return out


def _check_replicas(execution, local, axes) -> None:
    """Under msrun: the ranks along the mesh dimensions `axes` leave out (replicated there) hold
    equal values (their elementwise max and min agree).

    Raises:
        ValueError: they differ.
    """
    mesh = execution.mesh
    free = [a for a in range(mesh.ndim) if a not in axes]
    if not free:
        return
    coords = mesh.coords(execution.local_ranks[0])
    group = execution.group(free, {a: coords[a] for a in axes})
    high = execution.collectives.all_reduce([local], "max", group)[0]
    low = execution.collectives.all_reduce([local], "min", group)[0]
    if not np.array_equal(high.asnumpy(), low.asnumpy()):
        names = ", ".join(repr(mesh.alias_names[a]) for a in free)
        raise ValueError(f"DTensor.from_local(run_check=True): the ranks along mesh dimension {names} hold "
                         "different values where the placements say Replicate")


def _check_local_shapes(execution, layout: TensorLayout, shards, axes, global_shape, placements,
                        run_check: bool) -> None:
    """Each held shard has the shape of its rank's piece of `global_shape`; with `run_check` under
    msrun the ranks agree first on whether any of them differs (so every process raises).

    Raises:
        ValueError: a shard's shape is not its piece's.
    """
    wrong = []
    for key, shard in shards.items():
        coords = dict(zip(axes, key))
        expected = tuple(layout.dim_bounds(d, n, coords)[1] for d, n in enumerate(global_shape))
        if tuple(shard.shape) != expected:
            rank = next(r for r in execution.local_ranks
                        if all(execution.mesh.coords(r)[a] == v for a, v in coords.items()))
            wrong.append(f"rank {rank} has {tuple(shard.shape)}, expected {expected}")
    if run_check and len(execution.local_ranks) == 1 and execution.mesh.size > 1:
        from mindspore_hyper.comm.collectives import AxisGroup

        ranks = tuple(execution.mesh.ranks)
        group = AxisGroup("world", ranks, (ranks.index(execution.local_ranks[0]),), records=False)
        flag = Tensor(np.array([1.0 if wrong else 0.0], np.float32))
        if float(execution.collectives.all_reduce([flag], "max", group)[0].asnumpy()[0]) and not wrong:
            wrong.append("another rank's local shape is not its piece")
    if wrong:
        raise ValueError(f"DTensor.from_local: local shapes do not lay out shape={tuple(global_shape)} under "
                         f"{placements} (torch.chunk pieces: ceil(size / devices) rows each, the trailing ranks "
                         f"fewer or none): {'; '.join(wrong)}")


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
