"""Cut a model into pipeline stages: its layers in order, a split, and one Cell per stage.

A model can be pipelined when its forward is a chain of layers: an `nn.SequentialCell`, an
`nn.WithLossCell` whose backbone is one (the loss runs on the last stage with the remaining
inputs as targets), or any Cell with `pipeline_layers()` (the chain) and optionally
`pipeline_loss(output, *targets)`. The first model input feeds stage 0; the others are the
loss's targets. Any other model with an nn.CellList of blocks is pipelined by running its own
construct per stage (traced_chain.py): its layers are the blocks, and every stage gets all the
model inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from mindspore import nn

from mindspore_hyper.pipeline.traced_chain import TracedChain, block_list_candidates
from mindspore_hyper.schedule.schedule import Schedule
from mindspore_hyper.strategy.resolve import _partition

__all__ = ["PipelineLayers", "StageCell", "layers_of", "balanced_split", "split_from_table", "check_split",
           "check_unshared"]


@dataclass(frozen=True)
class PipelineLayers:
    """A model as a chain of layers.

    Attributes:
        cells: the layers in model order.
        names: a name per layer (its Cell path in the model).
        parameters: per layer, the model's names of its trainable parameters.
        loss: the loss Cell/function applied by the last stage, or None (the last layer's
            output is the model's output).
        param_names: id(Parameter) -> the parameter's name in the model.
        chain: for a model pipelined through its construct (an nn.CellList of blocks), the
            TracedChain; None for a chain of Cells.
    """

    cells: Tuple[nn.Cell, ...]
    names: Tuple[str, ...]
    parameters: Tuple[Tuple[str, ...], ...]
    loss: Optional[Callable]
    param_names: Dict[int, str]
    chain: Optional[TracedChain] = None

    def with_outer_parameters(self) -> "PipelineLayers":
        """After the chain's trace: the layers of the CellList it kept (of several candidates, the one
        the forward calls), with the Parameters outside the blocks counted with the first layer (the
        ones stage 0 trains) and the last layer (the last stage's)."""
        cell_names = {id(c): name for name, c in self.chain.model.cells_and_names()}
        cells = tuple(self.chain.blocks)
        names = [[self.param_names[id(p)] for p in c.trainable_params() if id(p) in self.param_names] for c in cells]
        for index, params in ((0, self.chain.prologue_params), (-1, self.chain.epilogue_params)):
            names[index] += [self.param_names[id(p)] for p in params if self.param_names[id(p)] not in names[index]]
        return replace(self, cells=cells, names=tuple(cell_names.get(id(c), f"layer{i}") for i, c in enumerate(cells)),
                       parameters=tuple(tuple(n) for n in names))

    def __len__(self) -> int:
        return len(self.cells)

    def weights(self, model) -> List[float]:
        """A cost prior per layer: its parameter count + 1 (a layer without parameters is cheap, not free)."""
        sizes = {name: math.prod(p.shape) for name, p in model.parameters_and_names()}
        return [1.0 + sum(sizes[n] for n in names) for names in self.parameters]


def layers_of(model: nn.Cell) -> Optional[PipelineLayers]:
    """The chain of layers of `model`, or None when it is neither a chain of Cells nor holds an
    nn.CellList (see module docstring)."""
    loss, chain = None, None
    if hasattr(model, "pipeline_layers"):
        cells = list(model.pipeline_layers())
        loss = getattr(model, "pipeline_loss", None)
    elif isinstance(model, nn.SequentialCell):
        cells = list(model.cell_list)
    elif isinstance(model, nn.WithLossCell) and isinstance(model._backbone, nn.SequentialCell):
        cells = list(model._backbone.cell_list)
        loss = model._loss_fn
    else:
        found = block_list_candidates(model)
        if not found:
            return None
        chain = TracedChain(model, *found[0], alternatives=found[1:])
        cells = chain.blocks
    cell_names = {id(c): name for name, c in model.cells_and_names()}
    param_names = {id(p): name for name, p in model.parameters_and_names()}
    names, params = [], []
    for i, cell in enumerate(cells):
        if not isinstance(cell, nn.Cell):
            raise ValueError(f"pipeline layer {i} of {type(model).__name__} is a {type(cell).__name__}, expected an nn.Cell")
        names.append(cell_names.get(id(cell), f"layer{i}"))
        params.append(tuple(param_names[id(p)] for p in cell.trainable_params() if id(p) in param_names))
    return PipelineLayers(tuple(cells), tuple(names), tuple(params), loss, param_names, chain)


def check_split(counts: Sequence[int], num_layers: int, num_virtual_stages: int, what: str) -> Tuple[int, ...]:
    """`counts` as a valid split of `num_layers` layers into `num_virtual_stages` stages.

    Raises:
        ValueError: naming `what` (the argument) when the counts do not fit.
    """
    counts = tuple(int(c) for c in counts)
    if len(counts) != num_virtual_stages:
        raise ValueError(f"{what}={counts}: {len(counts)} entries, but the schedule has {num_virtual_stages} virtual "
                         f"stages (pipeline ranks x chunks)")
    if sum(counts) != num_layers or min(counts) < 1:
        raise ValueError(f"{what}={counts}: expected one count >= 1 per virtual stage summing to the model's "
                         f"{num_layers} layers")
    return counts


def balanced_split(weights: Sequence[float], num_virtual_stages: int) -> Tuple[int, ...]:
    """Layers per stage: contiguous runs minimising the largest run's weight.

    Raises:
        ValueError: fewer layers than stages.
    """
    if len(weights) < num_virtual_stages:
        raise ValueError(f"the model has {len(weights)} pipeline layers but the schedule needs {num_virtual_stages} "
                         f"virtual stages (pipeline.stages x pipeline.chunks); each stage needs at least one layer")
    stage_of = _partition(list(weights), num_virtual_stages)
    return tuple(stage_of.count(s) for s in range(num_virtual_stages))


def split_from_table(layers: PipelineLayers, table) -> Optional[Tuple[int, ...]]:
    """Layers per stage from the StrategyTable's parameter stages (YAML `pipeline: N`), or None
    when the table has no stages or they are not contiguous in layer order. A layer without
    parameters joins the stage of the layer before it."""
    n = table.pipeline_stages
    if table.config is None or n < 2 or not any(row.stage is not None for row in table):
        return None
    stages, current = [], 0
    for names in layers.parameters:
        found = {table[n].stage for n in names if n in table and table[n].stage is not None}
        if len(found) > 1:
            return None
        if found:
            current = found.pop()
        stages.append(current)
    if any(b < a for a, b in zip(stages, stages[1:])):
        return None
    counts = tuple(stages.count(s) for s in range(n))
    return counts if min(counts) >= 1 else None


class StageCell(nn.Cell):
    """A contiguous run of the model's layers (plus the loss on the last stage).

    `parameters_and_names` yields the model's own parameter names, so strategies, reports and
    checkpoints see the same names as on the whole model. The layers are shared with the model
    (the same Cells and Parameters).
    """

    def __init__(self, cells: Sequence[nn.Cell], param_names: Dict[int, str], loss: Optional[Callable] = None):
        super().__init__(auto_prefix=False)  # keep the Parameters' names
        self._order = []
        for i, cell in enumerate(cells):
            self.insert_child_to_cell(f"layer{i}", cell)
            self._order.append(cell)
        self._loss = loss
        if isinstance(loss, nn.Cell):
            self.insert_child_to_cell("loss", loss)
        self._param_names = param_names

    def construct(self, x, *targets):
        for cell in self._order:
            x = cell(x)
        if self._loss is not None:
            return self._loss(x, *targets)
        return x

    def parameters_and_names(self, name_prefix: str = "", expand: bool = True):
        seen = set()
        for _, cell in self.cells_and_names():
            for param in cell._params.values():
                if param is not None and id(param) not in seen:
                    seen.add(id(param))
                    yield self._param_names.get(id(param), param.name), param


def check_unshared(layers: PipelineLayers, schedule: Schedule, split: Sequence[int]) -> None:
    """Under msrun a Parameter used by stages on two ranks (tied weights) would get two
    diverging copies: refused.

    Args:
        layers: the model's pipeline layers (parameter names per layer).
        schedule: the Schedule (its `stage_to_rank`).
        split: layers per virtual stage.

    Raises:
        ValueError: a parameter is used by stages on two ranks.
    """
    owner = {}
    start = 0
    for stage, count in enumerate(split):
        rank = schedule.stage_to_rank[stage]
        for names in layers.parameters[start:start + count]:
            for name in names:
                if owner.setdefault(name, rank) != rank:
                    raise ValueError(f"pipeline under msrun: parameter {name!r} is used by stages on ranks "
                                     f"{owner[name]} and {rank} (tied weights); run it in simulation")
        start += count
