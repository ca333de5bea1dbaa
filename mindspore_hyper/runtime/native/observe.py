"""Observe every primitive call of a model by running it once in simulation.

Native mode needs, for each `Primitive` a Cell owns, the rank and shape of every input and the
layout each input should have. The simulation sees exactly that: every op reaches the DTensor
dispatcher with its global input shapes, and the op's sharding rule decides the input layouts.
So the model runs one forward on the strategy's mesh (all devices in this process) and each
call of a Primitive attribute of the running Cell is recorded with those shapes and layouts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from mindspore.ops.primitive import Primitive

from mindspore_hyper.shard.tensor_layout import TensorLayout
from mindspore_hyper.strategy.resolve import StrategyTable

__all__ = ["PrimitiveCall", "Observation", "observe_primitives"]


@dataclass
class PrimitiveCall:
    """One primitive of one Cell as the simulation ran it.

    Attributes:
        cell: the Cell's name in the model ("" for the model itself).
        attr: the attribute holding the Primitive.
        prim: the Primitive.
        op: the op name the dispatcher saw.
        shapes: global shape of each tensor input, in order.
        layouts: the layout the op's sharding rule gave each tensor input.
        parameters: input position -> name of the model Parameter passed there.
        calls: how many times it ran in the forward.
    """

    cell: str
    attr: str
    prim: Primitive
    op: str
    shapes: Tuple[Tuple[int, ...], ...]
    layouts: Tuple[TensorLayout, ...]
    parameters: Dict[int, str] = field(default_factory=dict)
    calls: int = 1

    @property
    def key(self) -> str:
        return f"{self.cell}.{self.attr}" if self.cell else self.attr


@dataclass
class Observation:
    """What one simulated forward showed.

    Attributes:
        primitives: "<cell>.<attr>" -> the PrimitiveCall (first call; see `conflicts`).
        conflicts: primitives called again with other shapes or layouts (their first call is used).
        unowned: op name -> calls of ops that are no Primitive attribute of the running Cell
            (functional ops such as `ops.matmul` in a construct): MindSpore chooses their strategies.
        input_shapes: global shape of each tensor input of the model.
    """

    primitives: Dict[str, PrimitiveCall] = field(default_factory=dict)
    conflicts: List[str] = field(default_factory=list)
    unowned: Dict[str, int] = field(default_factory=dict)
    input_shapes: List[Tuple[int, ...]] = field(default_factory=list)


def observe_primitives(model, table: StrategyTable, example_inputs: Sequence, loss_fn=None) -> Observation:
    """Run `model` once (forward, no gradients) on `table`'s simulated mesh with
    `example_inputs` and record its primitive calls; with `loss_fn` the last input is the label
    and the loss runs on the model's (global) output, outside the observation.

    Raises:
        ValueError: an input cannot be split as the strategy declares (from the simulation).
    """
    from mindspore import Tensor

    from mindspore_hyper.runtime.simulation.simulated_model import SimulatedModel
    from mindspore_hyper.runtime.simulation.runtime import SimulationRuntime

    observation = Observation(input_shapes=[tuple(x.shape) for x in example_inputs if isinstance(x, Tensor)])
    sim = SimulatedModel(model, table, SimulationRuntime())
    names = {id(cell): name for name, cell in model.cells_and_names()}
    parameter_names = {id(p): p.name for p in model.get_parameters()}
    running: List[str] = []
    handles = []
    def enter(cell, inputs) -> None:
        running.append(names[id(cell)])

    def leave(cell, inputs, output) -> None:  # returning None keeps the output
        running.pop()

    for _, cell in model.cells_and_names():
        handles.append(cell.register_forward_pre_hook(enter))
        handles.append(cell.register_forward_hook(leave))

    def observe(call, decision) -> None:
        name = running[-1] if running else ""
        cell = _cell(model, name)
        attr = _primitive_attr(cell, call)
        if attr is None:
            observation.unowned[call.name] = observation.unowned.get(call.name, 0) + 1
            return
        shapes = tuple(tuple(t.shape) for t in call.tensors)
        layouts = tuple(decision.inputs)
        params = {}
        for i, source in enumerate(call.sources):  # a Parameter, or the DTensor laying it out
            pid = getattr(source, "_parameter_id", None) or id(source)
            if pid in parameter_names:
                params[i] = parameter_names[pid]
        record = PrimitiveCall(name, attr, getattr(cell, attr), call.name, shapes, layouts, params)
        seen = observation.primitives.get(record.key)
        if seen is None:
            observation.primitives[record.key] = record
            return
        seen.calls += 1
        if (seen.shapes, [lay.tensor_map for lay in seen.layouts]) != (shapes, [lay.tensor_map for lay in layouts]):
            observation.conflicts.append(f"{record.key}: called with {shapes} laid out "
                                         f"{[lay.tensor_map for lay in layouts]} after {seen.shapes}")

    sim.execution.observer = observe
    try:
        if loss_fn is None:
            sim(*example_inputs)
        else:
            loss_fn(sim(*example_inputs[:-1]), example_inputs[-1])
    finally:
        sim.execution.observer = None
        for handle in handles:
            handle.remove()
    return observation


def _cell(model, name: str):
    cell = model
    for part in name.split(".") if name else ():
        cell = cell._cells[part]
    return cell


def _primitive_attr(cell, call):
    """The attribute of `cell` holding the Primitive `call` runs: the same object when the
    dispatcher sees it, else the only Primitive attribute of that op name."""
    prims = [(attr, p) for attr, p in vars(cell).items() if isinstance(p, Primitive)]
    prims += [(attr, p) for attr, p in getattr(cell, "_primitives", {}).items() if isinstance(p, Primitive)]
    if call.prim is not None:
        same = [attr for attr, p in prims if p is call.prim]
        if same:
            return same[0]
    named = sorted({attr for attr, p in prims if p.name == call.name})
    return named[0] if len(named) == 1 else None
