"""A device group at run time: its Cells, each run as a simulated model on the group's own mesh.

Each Cell's model runs the Cell's slice of the job's StrategyTable (`group_slice`): the group's
rows were resolved once, on the group's mesh, by the MPMD build (`resolve_placements`); a device
move (rebalancing) that gives the group other ranks resolves its rows into the table again.

The runner takes over its Cells' `construct` (an instance attribute, so the model's code and
parameter names stay untouched): a call from the model enters the group's simulated mesh (inputs
laid out by the group's strategy), runs the Cell there and returns global tensors, which the
next group lays out by its own strategy. In simulation that gather-then-split is the
redistribution between the two groups' layouts, differentiable both ways.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Tuple

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import _Function
from mindspore.graph.api import _pynative_executor

from mindspore_hyper.dtensor import DTensor
from mindspore_hyper.mpmd.group_placement import GroupPlacement
from mindspore_hyper.runtime.report import rank_ranges
from mindspore_hyper.runtime.simulation.simulated_model import SimulatedModel
from mindspore_hyper.strategy.group_table import group_slice
from mindspore_hyper.strategy.resolve import StrategyTable

__all__ = ["GroupRunner"]

# (runner, cell name, inputs, outputs, seconds) -> the call's task index on the timeline
CallHook = Callable[["GroupRunner", str, tuple, object, float], int]


class _GradientArrival:
    """Identity on a group output; its backward reports when autograd reaches the output (the
    start of the group's backward: the backward runs the recorded ops in reverse order). A call
    is one autograd node (`_ReportingNode`, a custom autograd function, not a Cell with a custom
    `bprop`, so `run_backward`, torch-style `loss.backward()`, runs it as `value_and_grad` does)."""

    def __init__(self, report: Callable[[], None]):
        self.report = report

    def __call__(self, x: Tensor) -> Tensor:
        return _ReportingNode.apply(x, None, self.report)


class _BackwardEnd:
    """Identity on a group input, also reading `anchor` (a scalar Parameter the training step
    differentiates): its backward runs right after the group's backward, even when the input
    itself needs no gradient, and reports the time (one autograd node, as `_GradientArrival`)."""

    def __init__(self, report: Callable[[], None]):
        self.report = report

    def __call__(self, x: Tensor, anchor: Parameter) -> Tensor:
        return _ReportingNode.apply(x, anchor, self.report)


class _ReportingNode(_Function):
    """Identity on x (reading `anchor` when not None) whose backward calls `report()`."""

    @staticmethod
    def forward(ctx, x, anchor, report):  # pylint: disable=arguments-differ
        ctx.anchor, ctx.report = anchor, report
        return x

    @staticmethod
    def backward(ctx, dout):  # pylint: disable=arguments-differ
        ctx.report()
        return dout, None if ctx.anchor is None else ops.zeros_like(ctx.anchor), None


_FLOATS = (ms.float16, ms.float32, ms.float64, ms.bfloat16)


def _mark_input(args: tuple, anchor, report: Callable[[], None]) -> tuple:
    """`args` with its first floating-point Tensor passed through a _BackwardEnd (unchanged
    when there is none)."""
    for k, a in enumerate(args):
        if isinstance(a, Tensor) and not isinstance(a, Parameter) and a.dtype in _FLOATS:
            return args[:k] + (_BackwardEnd(report)(a, anchor),) + args[k + 1:]
    return args


def _mark_outputs(out, report: Callable[[], None]):
    floats = _FLOATS
    if isinstance(out, Tensor):
        return _GradientArrival(report)(out) if out.dtype in floats else out
    if isinstance(out, (tuple, list)):
        return type(out)(_mark_outputs(o, report) for o in out)
    return out


class GroupRunner:
    """Runs the Cells of one placement on the group's mesh (see module docstring).

    Args:
        network: the whole model (the Cells are looked up by name in it).
        placement: the group's ranks, Cells and strategy.
        runtime: the simulation runtime (holds every virtual device in this process).
        table: the job's StrategyTable, holding the group's rows (`resolve_placements`; its
            `optimizer_states` are the memory reports' assumption).
        on_call: called after each Cell call with (runner, cell name, inputs, outputs, seconds);
            returns the call's task index. With `on_output_gradient` set, the outputs of a call
            under gradient recording report, with that index, when the backward reaches them.
    """

    def __init__(self, network: nn.Cell, placement: GroupPlacement, runtime, table: StrategyTable,
                 on_call: Optional[CallHook] = None):
        self.network = network
        self.runtime = runtime
        self.table = table
        self.on_call = on_call
        self.on_output_gradient: Optional[Callable[[int], None]] = None  # gets on_call's result
        self.on_backward_end: Optional[Callable[[int], None]] = None
        self.backward_anchor: Optional[Parameter] = None  # see _BackwardEnd
        self.cells: Dict[str, nn.Cell] = dict((n, c) for n, c in network.cells_and_names() if n in placement.cells)
        self.models: Dict[str, SimulatedModel] = {}
        self.placement = placement
        self._inside: Dict[str, bool] = {}
        self.build(placement)
        for name, cell in self.cells.items():
            cell.construct = self._entry(name, cell)

    @property
    def name(self) -> str:
        return self.placement.name

    def build(self, placement: GroupPlacement) -> None:
        """(Re)lay the group's Cells out on `placement`'s mesh (used again after a device move)."""
        models = {name: SimulatedModel(cell, table, self.runtime) for name, cell, table in self.slices(placement)}
        self.placement, self.models = placement, models

    def slices(self, placement: GroupPlacement) -> List[Tuple[str, nn.Cell, StrategyTable]]:
        """(Cell name, Cell, its slice of the job's table) for each of the group's Cells on
        `placement`; a placement whose rows the table does not hold (a device move gave the group
        other ranks) is resolved into the table first."""
        if not placement.held_by(self.table):
            placement.resolve_into(self.table, self.network)
        return [(name, cell, group_slice(self.table, placement.name, name)) for name, cell in self.cells.items()]

    def begin_step(self, inputs: tuple) -> None:
        """Called with the model's inputs at the start of each forward (nothing to do here)."""

    def end_step(self) -> None:
        """Called after each training step's optimizer update (nothing to do here)."""

    def _entry(self, name: str, cell: nn.Cell):
        plain = type(cell).construct

        def construct(*args):
            if self._inside.get(name):
                return plain(cell, *args)  # the group's simulated model runs the Cell itself
            self._check_batch(name, args)
            marked = self.on_output_gradient is not None and _pynative_executor.requires_grad()
            slot: Dict[str, int] = {}
            call_args = _mark_input(args, self.backward_anchor, lambda: self.on_backward_end(slot["index"])) \
                if marked and self.backward_anchor is not None else args
            self._inside[name] = True
            start = time.perf_counter()
            try:
                out = self.models[name](*call_args)
            finally:
                self._inside[name] = False
            seconds = time.perf_counter() - start
            if marked:
                out = _mark_outputs(out, lambda: self.on_output_gradient(slot["index"]))
            if self.on_call is not None:
                slot["index"] = self.on_call(self, name, args, out, seconds)
            return out

        return construct

    def _check_batch(self, name: str, args: tuple) -> None:
        expected = self.placement.group.batch_size
        for i, arg in enumerate(args):
            if expected is not None and isinstance(arg, Tensor) and arg.ndim >= 1 and arg.shape[0] != expected:
                raise ValueError(f"{self.placement.group.path}.batch_size: {expected}, but Cell {name!r} got input "
                                 f"{i} with batch {arg.shape[0]} (shape {tuple(arg.shape)}); the group's batch per "
                                 "step must match its batch_size")
        self._check_split(name, args)

    def _check_split(self, name: str, args: tuple) -> None:
        """Refuse, naming the group and its strategy's field, an input the group's mesh cannot
        split (e.g. a batch of 32 over 128 data-parallel ranks): the group does not fit its batch."""
        strategy = self.placement.strategy
        for i, arg in enumerate(args):
            if not isinstance(arg, Tensor) or isinstance(arg, (Parameter, DTensor)):  # as the runtime lays out
                continue
            why = strategy.input_split_error(tuple(arg.shape))
            if why:
                raise ValueError(f"{self.placement.strategy_field}: group {self.name!r} (ranks "
                                 f"{rank_ranges(list(self.placement.ranks))}) cannot split input {i} of its Cell {name!r}, "
                                 f"shape {tuple(arg.shape)}: {why}; or give the group a rank count that divides it")

    def batch_sizes(self, args: tuple) -> List[int]:
        return [a.shape[0] for a in args if isinstance(a, Tensor) and a.ndim >= 1]

