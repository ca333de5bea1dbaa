"""What this process holds of a model (and its optimizer): every parameter and optimizer state,
the Parameter holding it here, the region of the global tensor that Parameter holds, and the
tensor's layout over the mesh (which region each rank holds). The same view for a plain Cell
(one device), a simulated model (every virtual device in this process: its Parameters hold the
global tensors) and a distributed model (this process's shards)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from mindspore import Parameter, nn

from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.regions import rank_box
from mindspore_hyper.dtensor.padded_storage import padded_array
from mindspore_hyper.runtime.parallel_model import ParallelModel
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["HeldTensor", "Holdings", "holdings_of", "owner_of", "SINGLE_MESH", "register_cell_view"]

SINGLE_MESH = Layout((1,), ("device",))  # the mesh of a plain Cell
PARAMETERS, OPTIMIZER = "parameters", "optimizer"


@dataclass(frozen=True)
class HeldTensor:
    """One parameter or optimizer state as this process holds it.

    Attributes:
        section: "parameters" or "optimizer".
        name: the parameter's name, or the optimizer's name of the state (e.g. "moment1.fc.weight").
        param: the Parameter holding this process's region.
        global_shape: the whole tensor's shape.
        dtype: MindSpore dtype name.
        layout: the tensor's layout on the mesh (rank r holds `box(r)`).
        holders: the mesh ranks holding a region of it.
        held: the region `param` holds.
        state_of: for a per-parameter optimizer state, the parameter's name.
        stored_rows: where `param` stores `held` padded (its rows, then zero rows up to this
            many: `fully_shard` of fewer rows than devices under msrun, dtensor/padded_storage.py);
            None where it stores `held` as it is. The checkpoint holds the real rows only.
    """

    section: str
    name: str
    param: Parameter
    global_shape: Tuple[int, ...]
    dtype: str
    layout: TensorLayout
    holders: Tuple[int, ...]
    held: Box
    state_of: Optional[str] = None
    stored_rows: Optional[int] = None

    def box(self, rank: int) -> Box:
        return rank_box(self.layout, rank, self.global_shape)

    @property
    def stored_shape(self) -> Tuple[int, ...]:
        """The shape `param` has: `held`'s, padded to `stored_rows` rows where it is padded."""
        shape = self.held.shape
        return shape if self.stored_rows is None else (self.stored_rows,) + shape[1:]

    def held_array(self) -> np.ndarray:
        """The values of `held`: `param`'s host array (sharing its memory), its padding rows cut off."""
        value = self.param.asnumpy()
        return value if self.stored_rows is None else value[:self.held.shape[0]]

    def to_stored(self, value: np.ndarray) -> np.ndarray:
        """`value` (of `held`'s shape, read from a checkpoint) as `param` stores it: padded with zero rows."""
        return value if self.stored_rows is None else padded_array(value, self.stored_rows)


@dataclass
class Holdings:
    """A process's view of a model for checkpointing.

    Attributes:
        mesh: the model's mesh (SINGLE_MESH for a plain Cell).
        mode: "single", "simulation" or "distributed".
        local_ranks: the mesh ranks this process holds (and writes files for).
        tensors: parameters first, then optimizer states.
        optimizer_class: the optimizer's class name, or None.
        group: the communicator of the whole job under msrun (None in one process).
        model: the ParallelModel, to tell after a load (None for a plain Cell).
    """

    mesh: Layout
    mode: str
    local_ranks: Tuple[int, ...]
    tensors: List[HeldTensor]
    optimizer_class: Optional[str]
    group: object = None
    model: Optional[ParallelModel] = None

    @property
    def lead(self) -> bool:
        """Whether this process writes the manifest (it holds mesh rank 0)."""
        return min(self.mesh.ranks) in self.local_ranks

    @property
    def processes(self) -> Tuple[int, ...]:
        """The first mesh rank of every process of the job (one rank per process under msrun)."""
        return tuple(self.mesh.ranks) if self.group is not None else (self.local_ranks[0],)

    def exchange(self, row: np.ndarray) -> Dict[int, np.ndarray]:
        """Collective over the job: every process's int64 `row`, by the process's first rank."""
        if self.group is None:
            return {self.local_ranks[0]: np.asarray(row, np.int64)}
        table = np.zeros((self.mesh.size, len(row)), np.int64)
        table[self.local_ranks[0]] = row
        table = self.group.all_reduce(table)
        return {r: table[r] for r in self.processes}

    def failed_ranks(self, failed: bool) -> List[int]:
        """Collective over the job: the ranks that report `failed` (every process learns the same list)."""
        return [r for r, row in self.exchange(np.array([int(failed)])).items() if row[0]]

    def after_load(self) -> None:
        if self.model is not None:
            self.model.after_parameters_set()


_CELL_VIEWS: List[Callable[[nn.Cell], Optional[Holdings]]] = []


def register_cell_view(view: Callable[[nn.Cell], Optional[Holdings]]) -> None:
    """Let a front end that lays out a plain Cell's Parameters itself (the HyperParallel API's
    `fully_shard`, `parallelize_module`, ...) give that Cell's holdings: `view(cell)` returns
    them, or None for a Cell it did not lay out (the Cell is then one device's). Without it such
    a Cell's pieces would be saved as whole tensors (under msrun each process holds its pieces)."""
    if view not in _CELL_VIEWS:
        _CELL_VIEWS.append(view)


def _cell(cell: nn.Cell) -> Holdings:
    for view in _CELL_VIEWS:
        holdings = view(cell)
        if holdings is not None:
            return holdings
    return _single(cell)


def holdings_of(model, optimizer: Optional[nn.Optimizer] = None) -> Holdings:
    """This process's holdings of `model` (a ParallelModel, a plain nn.Cell, or an object whose
    `checkpoint_holdings()` gives them) and `optimizer`.

    Raises:
        CheckpointError: `model` or `optimizer` of the wrong type, an optimizer updating
            Parameters that are not the model's, a Parameter whose shape differs from the region
            it should hold.
    """
    if isinstance(model, ParallelModel):
        holdings = _parallel(model)
    elif not isinstance(model, nn.Cell) and callable(getattr(model, "checkpoint_holdings", None)):
        holdings = model.checkpoint_holdings()  # another front end's view (the HyperParallel API's state dicts)
    elif isinstance(model, nn.Cell):
        holdings = _cell(model)
    else:
        raise CheckpointError(f"model: expected a ParallelModel (auto_parallelize's result) or an nn.Cell, got "
                              f"{type(model).__name__}")
    if optimizer is not None:
        if not isinstance(optimizer, nn.Optimizer):
            raise CheckpointError(f"optimizer: expected an nn.Optimizer, got {type(optimizer).__name__}")
        holdings.tensors.extend(_optimizer_states(holdings, optimizer, model))
        holdings.optimizer_class = type(optimizer).__name__
    for t in holdings.tensors:
        if tuple(t.param.shape) != t.stored_shape:
            raise CheckpointError(f"{t.section} {t.name!r}: its Parameter has shape {tuple(t.param.shape)} but "
                                  f"should hold the region {t.held} of {t.global_shape}"
                                  + (f" padded to {t.stored_rows} rows" if t.stored_rows is not None else ""))
    return holdings


def _single(cell: nn.Cell) -> Holdings:
    tensors = [HeldTensor(PARAMETERS, name, p, tuple(p.shape), str(p.dtype),
                          TensorLayout.replicated(SINGLE_MESH, len(p.shape)), (0,), Box.full(p.shape))
               for name, p in cell.parameters_and_names()]
    return Holdings(SINGLE_MESH, "single", (0,), tensors, None)


def _parallel(model: ParallelModel) -> Holdings:
    params = dict(model.network.parameters_and_names())
    tensors = [HeldTensor(PARAMETERS, row.name, params[row.name], row.global_shape, str(params[row.name].dtype),
                          row.layout, tuple(row.devices), Box.from_slices(model.held_region(row.name)))
               for row in model.table]
    group = None
    world = getattr(model, "world", None)
    if world is not None and world.size > 1:
        group = world.communicator(tuple(range(world.size)))
    return Holdings(model.mesh, model.runtime.name, tuple(model.local_ranks), tensors, None, group, model)


def _optimizer_states(holdings: Holdings, optimizer: nn.Optimizer, model) -> List[HeldTensor]:
    """Per-parameter states (named "<prefix>.<Parameter.name>", shaped like the Parameter the
    optimizer updates) laid out like the parameter's optimizer states; other optimizer
    Parameters (step counters, learning rate, beta powers) replicated. The optimizer knows
    Parameters by `Parameter.name`, which may differ from their path in the model (a Cell
    wrapped after it was built: "0.weight" at "_backbone.0.weight")."""
    held = {t.param.name: t for t in holdings.tensors}
    own = model.optimizer_parameters() if isinstance(model, ParallelModel) else model.get_parameters()
    own_ids = {id(p) for p in own}
    updated: Dict[str, Parameter] = {}
    for p in optimizer.parameters:
        if id(p) not in own_ids or p.name not in held:
            raise CheckpointError(f"optimizer: it updates Parameter {p.name!r}, which is not a parameter of the model; "
                                  "build it on the model's optimizer_parameters() (ParallelModel) or parameters")
        updated[p.name] = p
    mine = {id(p) for p in optimizer.parameters}
    out = []
    for name, state in optimizer.parameters_and_names():
        if id(state) in mine:
            continue
        owner = owner_of(name, state, updated)
        if owner is None:
            out.append(HeldTensor(OPTIMIZER, name, state, tuple(state.shape), str(state.dtype),
                                  TensorLayout.replicated(holdings.mesh, len(state.shape)), tuple(holdings.mesh.ranks),
                                  Box.full(state.shape)))
            continue
        param = held[owner]
        if isinstance(model, ParallelModel):
            layout = model.table[param.name].optimizer_layout
            region = Box.from_slices(model.held_region(param.name, optimizer=True))
        else:
            layout, region = param.layout, param.held
        out.append(HeldTensor(OPTIMIZER, name, state, param.global_shape, str(state.dtype), layout, param.holders,
                              region, param.name, param.stored_rows))
    return out


def owner_of(name: str, state: Parameter, updated: Dict[str, Parameter]) -> Optional[str]:
    """The parameter a state belongs to: the longest parameter name `name` ends with after a
    dot, among the optimizer's Parameters of the state's shape."""
    owners = [p for p, param in updated.items()
              if name.endswith("." + p) and tuple(param.shape) == tuple(state.shape)]
    return max(owners, key=len, default=None)
