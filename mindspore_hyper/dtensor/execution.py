"""Execution: the per-model state of one parallel run, shared by the DTensors of that run.

It answers the runtime questions the runtime-neutral DTensor code asks: which mesh ranks this
process holds (all of them in simulation, one under msrun), which collectives move data between
them, where communication and memory are accounted, how the model's parameters are laid out,
and which shard an op is running for right now.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from mindspore import Parameter

from mindspore_hyper.comm.collectives import AxisGroup, Collectives
from mindspore_hyper.dtensor import dispatch as dispatcher
from mindspore_hyper.dtensor import mutation
from mindspore_hyper.dtensor.accounting import Accounting, active_accounting
from mindspore_hyper.dtensor.redistribution import run_redistribution
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["Execution", "ParameterSlot", "Key", "standalone_execution", "in_process_collectives", "distribute_tensor",
           "lays_out"]

Key = Tuple[int, ...]
_LIVE: "weakref.WeakSet[Execution]" = weakref.WeakSet()  # every Execution alive (`lays_out`)


@dataclass
class ParameterSlot:
    """A model Parameter as the run sees it.

    Attributes:
        param: the Parameter (the global tensor in simulation, this process's shard under msrun).
        layout: its layout on the mesh.
        global_shape: the whole parameter's shape.
        zero_axes: mesh axes its optimizer states are additionally split over (ZeRO-1).
        local: True when `param` already holds the local shard (nothing to slice).
    """

    param: Any
    layout: TensorLayout
    global_shape: Tuple[int, ...]
    zero_axes: Tuple[int, ...] = ()
    local: bool = False


class Execution:
    """Per-model state of one parallel run (see module docstring).

    Args:
        mesh: the device mesh.
        local_ranks: the mesh ranks this process holds.
        collectives: the backend moving data between ranks (its recorder is set to this run's
            backward accounting).
        accounting: where this run's bookkeeping goes; None: the active accounting (for DTensors
            made outside a model).
        parameter_fan_out: how a parameter read by an op sharded over `group` gets its gradient
            summed: called as (tensor, group, slot) -> tensor; None: like any other tensor.
    """

    def __init__(self, mesh: Layout, local_ranks: Iterable[int], collectives: Collectives,
                 accounting: Optional[Accounting] = None,
                 parameter_fan_out: Optional[Callable[[Any, AxisGroup, ParameterSlot], Any]] = None):
        self.mesh = mesh
        self.local_ranks: Tuple[int, ...] = tuple(sorted(local_ranks))
        if not self.local_ranks:
            raise ValueError("Execution: a process must hold at least one rank of the mesh")
        self._coords = [mesh.coords(r) for r in self.local_ranks]
        self._groups: Dict[tuple, AxisGroup] = {}
        self._accounting = accounting
        self.collectives = collectives
        if hasattr(collectives, "recorder"):
            collectives.recorder = self.record_backward
        self.parameter_fan_out = parameter_fan_out
        self.parameters: Dict[int, ParameterSlot] = {}
        self._parameter_names: Dict[str, Any] = {}  # name -> Parameter, rebuilt when `parameters` grows
        self.parameter_dtensors: Dict[int, Any] = {}
        self.hints: List[Tuple[str, Optional[list]]] = []
        self._running: Optional[Dict[int, int]] = None
        self.holds_activations = False  # a training forward: new DTensors count until the step ends
        self.batch_shards = True  # run batchable ops once over their stacked shards (`dtensor.batched`)
        self.observer: Optional[Callable[[Any, Any], None]] = None  # sees (call, decision) of every op (native mode)
        self.shape_only = False  # shards are MetaTensors: shapes and bytes, no values (a dry run)
        self.context_parallel = None  # the strategy's ContextParallel: attention across the sequence axis
        self.context_attention: Optional[Callable[[Any, Any], Any]] = None  # (execution, call) -> result or None
        self.job_ranks: Optional[Tuple[int, ...]] = None  # the job's rank of each mesh rank; None: the same numbers
        _LIVE.add(self)

    # -- bookkeeping ---------------------------------------------------------------------------
    @property
    def accounting(self) -> Accounting:
        return self._accounting if self._accounting is not None else active_accounting()

    @contextlib.contextmanager
    def uncounted(self):
        """Inside the block, new DTensors are not counted as this run's live memory."""
        saved, holds = self._accounting, self.holds_activations
        self._accounting, self.holds_activations = Accounting(self.mesh.size), False
        try:
            yield
        finally:
            self._accounting, self.holds_activations = saved, holds

    def record_backward(self, kind: str, axis: str, send_bytes: int, input_bytes: int, cause: str = "") -> None:
        self.accounting.record_comm(kind, axis, send_bytes, input_bytes, backward=True, cause=cause)

    @property
    def holds_all_ranks(self) -> bool:
        return len(self.local_ranks) == self.mesh.size

    def parameter_from(self, dtensor) -> Parameter:
        """The Parameter `Parameter(dtensor, name=..., requires_grad=...)` makes (MindSpore's
        `Parameter.__init__` then sets its name and `requires_grad`): upstream's form of a laid-out
        weight. Like the Parameters the HyperParallel API lays out, it stays a MindSpore
        Parameter holding the global value (simulation) or this process's shard (msrun), with the
        DTensor's layout recorded in `parameters`, so a Cell laid out by the API reads it as that
        DTensor while it runs; `laid_out_view` keeps the mesh view the DTensor was made on.

        Raises:
            ValueError: a rank-local value (to_local() in simulation: no layout to keep), Partial
                placements (a Parameter holds a value, not pending sums), or a DTensor not made on
                a DeviceMesh (init_device_mesh).
        """
        from mindspore import Tensor, ops

        if dtensor.layout.is_rank_local:
            raise ValueError("Parameter(dtensor): the DTensor is a rank-local value (to_local() in simulation); pass "
                             "DTensor.from_local(value, mesh, placements) or distribute_tensor(...) instead")
        if dtensor.layout.is_partial:
            raise ValueError(f"Parameter(dtensor): the DTensor's placements {dtensor.placements} hold Partial sums; "
                             "redistribute it to Shard/Replicate placements first")
        if dtensor._device_mesh is None:
            raise ValueError("Parameter(dtensor): the DTensor was not made on a DeviceMesh (init_device_mesh); make "
                             "it with distribute_tensor or DTensor.from_local on one, or pass dtensor.full_tensor() "
                             "for a global Parameter")
        if self.holds_all_ranks:
            value = dtensor.full_tensor()
        else:
            (value,) = (dtensor.local_shard(rank) for rank in self.local_ranks)
        param = Parameter(ops.stop_gradient(Tensor(value)))
        self.parameters[id(param)] = ParameterSlot(param, dtensor.layout, tuple(dtensor.global_shape),
                                                   local=not self.holds_all_ranks)
        param.laid_out_view = dtensor._device_mesh
        return param

    def laid_out_parameter(self, tensor) -> Optional[Any]:
        """The model Parameter that `tensor` is, if the run lays it out: the Parameter itself, or
        a plain Tensor carrying its `param_info` (what MindSpore passes a sub-Cell for a
        Parameter argument, e.g. nn.GRU's weights to its recurrent cell); else None."""
        if id(tensor) in self.parameters:
            return tensor
        info = tensor.param_info
        if info is None or isinstance(tensor, Parameter):
            return None  # a Parameter object is matched by identity only
        if len(self._parameter_names) != len(self.parameters):
            self._parameter_names = {slot.param.name: slot.param for slot in self.parameters.values()}
        param = self._parameter_names.get(info.name)
        return param if param is not None and tuple(param.shape) == tuple(tensor.shape) else None

    # -- which shards live here ----------------------------------------------------------------
    def keys(self, axes: Sequence[int]) -> List[Key]:
        """Distinct coordinates on `axes` of the ranks this process holds, ascending."""
        if len(self.local_ranks) == self.mesh.size:
            return list(itertools.product(*[range(self.mesh.device_matrix[a]) for a in axes]))
        return sorted({tuple(c[a] for a in axes) for c in self._coords})

    def group(self, axes: Sequence[int], fixed: Dict[int, int]) -> AxisGroup:
        """The group along mesh `axes` through the held ranks whose coordinates match `fixed`
        (other axes); its local members are the held ones. Only the group through this
        process's first held rank records, so per-device figures count each collective once."""
        key = (tuple(axes), tuple(sorted(fixed.items())))
        if key not in self._groups:  # the held ranks never change: one scan per distinct group
            self._groups[key] = self._make_group(list(axes), fixed)
        return self._groups[key]

    def _make_group(self, axes: List[int], fixed: Dict[int, int]) -> AxisGroup:
        holders = [(r, c) for r, c in zip(self.local_ranks, self._coords)
                   if all(c[a] == v for a, v in fixed.items())]
        if not holders:
            raise AssertionError(f"no held rank has coordinates {fixed} (held: {self.local_ranks})")
        rank = holders[0][0]
        ranks = tuple(self.mesh.axis_group(rank, axes))
        held = set(self.local_ranks)
        local = tuple(i for i, r in enumerate(ranks) if r in held)
        name = "+".join(self.mesh.alias_names[a] for a in axes)
        return AxisGroup(name, ranks, local, records=self.local_ranks[0] in ranks)

    def member_index(self, axes: Sequence[int], coords: Dict[int, int]) -> int:
        """Index of the device with `coords` in a group along `axes` (mixed radix, major first)."""
        index = 0
        for a in axes:
            index = index * self.mesh.device_matrix[a] + coords[a]
        return index

    def group_size(self, axes: Sequence[int]) -> int:
        return math.prod(self.mesh.device_matrix[a] for a in axes)

    # -- the op running now --------------------------------------------------------------------
    def set_running(self, coords: Optional[Dict[int, int]]) -> None:
        self._running = coords

    def running_ranks(self) -> Optional[List[int]]:
        """While an op runs on one distinct shard: the held ranks that run it (the others along
        the axes it is not split over hold replicas); None outside."""
        if self._running is None:
            return None
        return [r for r, c in zip(self.local_ranks, self._coords)
                if all(c[a] == v for a, v in self._running.items())]

    # -- entry points of DTensor ---------------------------------------------------------------
    def dispatch(self, func, args, kwargs):
        return dispatcher.dispatch(self, func, args, kwargs)

    def getitem(self, dt, index):
        return dispatcher.dispatch_getitem(self, dt, index)

    def setitem(self, dt, index, value) -> None:
        dispatcher.dispatch_setitem(self, dt, index, value)

    def redistribute(self, dt, layout: TensorLayout, record: bool, grad_partial_axes):
        return run_redistribution(dt, layout, record, grad_partial_axes)

    def set_data(self, dt, value) -> None:
        """`dt.data = value`: the global `value` laid out as `dt` and written back (to its Parameter too)."""
        mutation.write_back(self, dt, dt, dispatcher.distribute(self, value, dt.layout))

    def __repr__(self) -> str:
        return f"Execution(mesh={self.mesh.device_matrix}, local_ranks={self.local_ranks})"


_STANDALONE: Dict[Tuple[Layout, str], Execution] = {}


def standalone_execution(mesh: Layout) -> Execution:
    """The execution of DTensors made outside a model: every rank in this process, in-process
    collectives chosen by the `sim_collectives` flag, bookkeeping to the active accounting."""
    from mindspore_hyper.context import get_context

    kind = get_context("sim_collectives")
    key = (mesh, kind)
    if key not in _STANDALONE:
        _STANDALONE[key] = Execution(mesh, mesh.ranks, in_process_collectives(kind))
    return _STANDALONE[key]


def in_process_collectives(kind: str):
    """The in-process backend named by the `sim_collectives` flag."""
    if kind == "library":
        from mindspore_hyper.comm.library_collectives import LibraryCollectives

        return LibraryCollectives()
    from mindspore_hyper.comm.inprocess_collectives import InProcessCollectives

    return InProcessCollectives()


def distribute_tensor(tensor, layout: TensorLayout):
    """Lay a global tensor out by `layout` as a DTensor of the standalone execution (every rank
    in this process; see `standalone_execution`).

    A dimension the layout does not divide is cut into torch.chunk pieces (`shard.chunking`).

    Raises:
        ValueError: the tensor's rank differs from the layout's.
    """
    return dispatcher.distribute(standalone_execution(layout.mesh), tensor, layout)


def lays_out(param) -> bool:
    """Whether a live Execution (a model the package runs, or a HyperParallel API layout) holds
    Parameter `param` among its laid-out parameters."""
    return any(getattr(execution.parameters.get(id(param)), "param", None) is param for execution in list(_LIVE))
