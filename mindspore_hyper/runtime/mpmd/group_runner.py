"""A device group at run time: its Cells, each run as a simulated model on the group's own mesh.

The runner takes over its Cells' `construct` (an instance attribute, so the model's code and
parameter names stay untouched): a call from the model enters the group's simulated mesh (inputs
laid out by the group's strategy), runs the Cell there and returns global tensors, which the
next group lays out by its own strategy. In simulation that gather-then-split is the
redistribution between the two groups' layouts, differentiable both ways.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

from mindspore import Tensor, nn

from mindspore_hyper.runtime.mpmd.placement import GroupPlacement
from mindspore_hyper.runtime.simulation.model import SimulatedModel
from mindspore_hyper.strategy.resolve import resolve_strategy

__all__ = ["GroupRunner"]

CallHook = Callable[["GroupRunner", str, tuple, object, float], None]


class GroupRunner:
    """Runs the Cells of one placement on the group's mesh (see module docstring).

    Args:
        network: the whole model (the Cells are looked up by name in it).
        placement: the group's ranks, Cells and strategy.
        runtime: the simulation runtime (holds every virtual device in this process).
        on_call: called after each Cell call with (runner, cell name, inputs, outputs, seconds).
        optimizer_states: optimizer states per parameter assumed by memory reports.
    """

    def __init__(self, network: nn.Cell, placement: GroupPlacement, runtime, on_call: Optional[CallHook] = None,
                 optimizer_states: int = 2):
        self.network = network
        self.runtime = runtime
        self.on_call = on_call
        self.optimizer_states = optimizer_states
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
        models = {}
        for name, cell in self.cells.items():
            table = resolve_strategy(cell, placement.strategy, optimizer_states=self.optimizer_states)
            for row in table:
                row.layout.check_shape(row.global_shape)
            models[name] = SimulatedModel(cell, table, self.runtime)
        self.placement, self.models = placement, models

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
            self._inside[name] = True
            start = time.perf_counter()
            try:
                out = self.models[name](*args)
            finally:
                self._inside[name] = False
            seconds = time.perf_counter() - start
            if self.on_call is not None:
                self.on_call(self, name, args, out, seconds)
            return out

        return construct

    def _check_batch(self, name: str, args: tuple) -> None:
        expected = self.placement.group.batch_size
        if expected is None:
            return
        for i, arg in enumerate(args):
            if isinstance(arg, Tensor) and arg.ndim >= 1 and arg.shape[0] != expected:
                raise ValueError(f"{self.placement.group.path}.batch_size: {expected}, but Cell {name!r} got input "
                                 f"{i} with batch {arg.shape[0]} (shape {tuple(arg.shape)}); the group's batch per "
                                 "step must match its batch_size")

    def batch_sizes(self, args: tuple) -> List[int]:
        return [a.shape[0] for a in args if isinstance(a, Tensor) and a.ndim >= 1]
