"""Native translation: a resolved StrategyTable -> MindSpore 2.10's semi-auto parallel training step.

`apply_native(model, table, example_inputs, loss_fn=None, optimizer=None, micro_batches=None)`:

1. runs the model once in simulation on the table's mesh (`observe.observe_primitives`): every
   Primitive a Cell owns is seen with its inputs' shapes and the layouts the simulation's
   sharding rules give them;
2. sets `prim.shard(in_strategy)` with `mindspore.parallel.Layout` results from those layouts
   (ranks and splits as observed, checked by `checks.check_in_strategy`);
3. builds the training step the way MindSpore's AutoParallel documentation does (docs/native.md
   cites the examples): loss (`nn.WithLossCell` or the model's own loss), micro-batching
   `mindspore.parallel.nn.Pipeline` when staged, `ops.value_and_grad`, `PipelineGradReducer`
   when staged, the optimizer update; wrapped in `AutoParallel(train_one_step, "semi_auto")`
   with `hsdp()`, `pipeline()` and `dataset_strategy()`.

MindSpore compiles this only on Ascend/GPU; on CPU only the attributes can be inspected
(MindSpore refuses "Invalid backend: CPU"), and calling the step raises (`run_refusals.py`: in one
process it would run on one device). Native mode never ran here.
"""
from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from mindspore_hyper.runtime.native.checks import check_in_strategy
from mindspore_hyper.runtime.native.run_refusals import native_step_type
from mindspore_hyper.runtime.native.observe import Observation, observe_primitives
from mindspore_hyper.shard.layout import NONE_ALIAS, Layout
from mindspore_hyper.shard.tensor_layout import TensorLayout
from mindspore_hyper.strategy.resolve import StrategyTable

__all__ = ["NativePlan", "apply_native", "native_mesh"]

# Primitives MindSpore takes no in-strategy for (shape-only ops) or that run on scalars.
NOT_SHARDED = ("Reshape", "Shape", "Cast", "ToDtype", "Depend", "Load")


@dataclass
class NativePlan:
    """What the native translation set, for inspection (`hyper_native_plan` on the returned net).

    Attributes:
        mesh: the device matrix handed to MindSpore (the pipeline axis removed when staged).
        primitive_layouts: "<cell>.<attr>" -> the `in_layout` dicts set by shard().
        primitive_shapes: "<cell>.<attr>" -> the observed global shape of each input.
        parameter_layouts: parameter name -> the MindSpore layout dict its consuming primitive implies.
        relaid_parameters: parameter name -> (the strategy's tensor map, the one its primitive
            needs): MindSpore lays the parameter out by its primitive's in_layout.
        cell_stages: Cell name -> pipeline stage set as `cell.pipeline_stage`.
        pipeline_stages: stages passed to `AutoParallel.pipeline` (1 = not called).
        micro_batches: micro-batches of `Pipeline` (1 = not wrapped).
        hsdp: keyword arguments passed to `AutoParallel.hsdp`, or None.
        dataset_strategy: what was passed to `AutoParallel.dataset_strategy`.
        left_to_mindspore: op name -> calls of ops that are no Primitive attribute of a Cell
            (functional ops), or primitives without a strategy (NOT_SHARDED, scalar inputs,
            called with different shapes): MindSpore chooses their strategies.
        skipped: what was not translated, with the reason.
    """

    mesh: Layout
    primitive_layouts: Dict[str, Tuple[dict, ...]] = field(default_factory=dict)
    primitive_shapes: Dict[str, Tuple[Tuple[int, ...], ...]] = field(default_factory=dict)
    parameter_layouts: Dict[str, dict] = field(default_factory=dict)
    relaid_parameters: Dict[str, Tuple[tuple, tuple]] = field(default_factory=dict)
    cell_stages: Dict[str, int] = field(default_factory=dict)
    pipeline_stages: int = 1
    micro_batches: int = 1
    hsdp: Optional[dict] = None
    dataset_strategy: object = None
    left_to_mindspore: Dict[str, int] = field(default_factory=dict)
    skipped: List[str] = field(default_factory=list)


def native_mesh(table: StrategyTable) -> Layout:
    """The device matrix MindSpore's strategies are written on.

    With pipeline stages MindSpore splits the devices into stages itself, and an operator's layout
    describes the devices of one stage: the pipeline axis is dropped. Otherwise the mesh as is.
    """
    mesh = table.mesh
    if table.pipeline_stages > 1 and table.config is not None and table.config.pipeline_axis in mesh.alias_names:
        keep = [i for i, a in enumerate(mesh.alias_names) if a != table.config.pipeline_axis]
        return Layout([mesh.device_matrix[i] for i in keep], [mesh.alias_names[i] for i in keep])
    return mesh


def apply_native(model, table: StrategyTable, example_inputs: Optional[Sequence] = None, loss_fn=None,
                 optimizer=None, micro_batches: Optional[int] = None, pipeline_scheduler: str = "1f1b",
                 parallel_mode: str = "semi_auto"):
    """Translate `table` onto `model` and build MindSpore's semi-auto parallel training step.

    Args:
        model: the `nn.Cell` the table was resolved on (its primitives are modified in place).
        table: the StrategyTable from `resolve_strategy(model, ...)`.
        example_inputs: one global batch as the model takes it (with labels if the model
            computes its loss): the model runs once on it in simulation to observe every
            primitive's input shapes and layouts.
        loss_fn: a loss Cell applied as `nn.WithLossCell(model, loss_fn)` (then the last
            example input is the label); None: the model returns its loss.
        optimizer: the optimizer updating `model`'s parameters; None: no training step, the net
            is the (loss) forward only and `hsdp` is not set.
        micro_batches: micro-batches of `Pipeline` when the table has pipeline stages (at least
            the number of stages; default: the number of stages).
        pipeline_scheduler: scheduler passed to `AutoParallel.pipeline` ("1f1b", "gpipe", ...).
        parallel_mode: AutoParallel mode, "semi_auto" by default.

    Returns:
        `AutoParallel` (a subclass that refuses to run on CPU or with fewer processes than the
        mesh's devices: `run_refusals.py`) wrapping the training step (`train_one_step(*batch) -> loss`), with
        `hyper_native_plan` (a NativePlan), `hyper_strategy_table`, `hyper_network` (the Cell
        the step differentiates) and `hyper_optimizer` attributes.

    Raises:
        ValueError: a context-parallel strategy (`runtime.native.context_parallel`), `example_inputs`
            missing, `micro_batches` below the number of stages, or an
            in-strategy MindSpore would refuse (rank, divisibility, device count, Layout).
    """
    from mindspore import nn

    if table.strategy.context is not None:
        from mindspore_hyper.runtime.native.context_parallel import refusal

        raise ValueError(refusal(model, table.strategy.context))
    if not example_inputs:
        raise ValueError("native mode: example_inputs=(...) is required: every primitive's strategy is derived from "
                         "the shapes seen by running the model once in simulation on one global batch")
    mesh = native_mesh(table)
    plan = NativePlan(mesh=mesh)
    observation = observe_primitives(model, table, tuple(example_inputs), loss_fn)
    _shard_primitives(table, mesh, observation, plan)
    network = model if loss_fn is None else nn.WithLossCell(model, loss_fn)
    plan.left_to_mindspore.update(observation.unowned)

    for name, cell in model.cells_and_names():
        if name in table.cell_stages:
            cell.pipeline_stage = table.cell_stages[name]
            plan.cell_stages[name] = table.cell_stages[name]
    if table.pipeline_stages > 1:
        micro = table.pipeline_stages if micro_batches is None else micro_batches
        if not isinstance(micro, int) or micro < table.pipeline_stages:
            raise ValueError(f"native mode: micro_batches={micro_batches!r}: expected an int >= the "
                             f"{table.pipeline_stages} pipeline stages (MindSpore's Pipeline requires micro_size >= stages)")
        from mindspore.parallel.nn import Pipeline

        network = Pipeline(network, micro)
        plan.micro_batches = micro
    elif micro_batches not in (None, 1):
        raise ValueError(f"native mode: micro_batches={micro_batches!r} given but the strategy has no pipeline stages")

    hsdp_axis = table.strategy.optimizer_state
    step = network if optimizer is None else _train_one_step(network, optimizer, table.pipeline_stages > 1,
                                                               hsdp_axis is not None)
    net = native_step_type()(step, parallel_mode)
    if table.pipeline_stages > 1:
        net.pipeline(stages=table.pipeline_stages, scheduler=pipeline_scheduler)
        plan.pipeline_stages = table.pipeline_stages
    if hsdp_axis is not None and optimizer is not None:
        # level1 shards weights and optimizer states (MindSpore's docs): the closest to the
        # strategy's optimizer-state sharding; MindSpore gathers the weights before use.
        plan.hsdp = {"shard_size": table.mesh.axis_size(hsdp_axis), "threshold": 0, "optimizer_level": "level1"}
        net.hsdp(**plan.hsdp)
    elif hsdp_axis is not None:
        plan.skipped.append("optimizer_state sharding: no optimizer given, so no training step and no hsdp()")
    plan.dataset_strategy = _dataset_strategy(table, mesh, example_inputs)
    net.dataset_strategy(plan.dataset_strategy)
    if table.config is not None and table.config.optimizer_offload:
        plan.skipped.append("optimizer.offload: not translated; native mode keeps optimizer states on the device "
                            "(HyperOffload runs in mode='simulation'/'distributed')")
        warnings.warn("native mode: parallel_config.optimizer.offload is not translated", UserWarning, stacklevel=3)
    if table.groups:
        names = ", ".join(f"{g.name} ({g.kind})" for g in table.groups)
        plan.skipped.append(f"device groups {names}: MPMD is not expressible in AutoParallel; run them with "
                            "mode='simulation' or 'distributed'")
        warnings.warn(f"native mode: device groups not translated: {names}", UserWarning, stacklevel=3)
    net.hyper_native_plan = plan
    net.hyper_strategy_table = table
    net.hyper_network = network
    net.hyper_optimizer = optimizer
    return net


def _train_one_step(network, optimizer, pipelined: bool, optimizer_sharded: bool):
    """MindSpore's functional training step (AutoParallel / PipelineGradReducer examples):
    value_and_grad over the optimizer's parameters, pipeline gradient accumulation when staged,
    then the update; compiled by `ms.jit`."""
    import mindspore as ms
    from mindspore import ops

    grad_fn = ops.value_and_grad(network, None, optimizer.parameters)
    reducer = None
    if pipelined:
        from mindspore.parallel.nn import PipelineGradReducer

        reducer = PipelineGradReducer(optimizer.parameters, opt_shard=optimizer_sharded)

    @ms.jit
    def train_one_step(*batch):
        loss, grads = grad_fn(*batch)
        if reducer is not None:
            grads = reducer(grads)
        optimizer(grads)
        return loss

    return train_one_step


def _shard_primitives(table: StrategyTable, mesh: Layout, observation: Observation, plan: NativePlan):
    conflicted = {c.split(":")[0] for c in observation.conflicts}
    rows = {row.name: row for row in table}
    for key, seen in observation.primitives.items():
        cell = seen.cell
        if any(fnmatch.fnmatchcase(cell, g.modules) or fnmatch.fnmatchcase(cell, g.modules + ".*") for g in table.groups):
            continue  # reported once per group by apply_native
        if seen.op in NOT_SHARDED or key in conflicted or any(len(s) == 0 for s in seen.shapes):
            plan.left_to_mindspore[seen.op] = plan.left_to_mindspore.get(seen.op, 0) + seen.calls
            continue
        layouts = [_on_native_mesh(layout, mesh) for layout in seen.layouts]
        check_in_strategy(key, seen.shapes, layouts, mesh)
        seen.prim.shard(tuple(_ms(layout) for layout in layouts))
        plan.primitive_layouts[key] = tuple(seen.prim.attrs["in_layout"])
        plan.primitive_shapes[key] = seen.shapes
        for position, pname in seen.parameters.items():
            plan.parameter_layouts[pname] = _ms(layouts[position]).to_dict()
            row = rows.get(pname)
            if row is not None and row.layout.tensor_map != layouts[position].tensor_map:
                plan.relaid_parameters[pname] = (row.layout.tensor_map, layouts[position].tensor_map)


def _on_native_mesh(layout: TensorLayout, mesh: Layout) -> TensorLayout:
    """`layout` without Partial placements (MindSpore reduces them itself) and on `mesh` (axes
    missing from it, the pipeline axis, left unsplit)."""
    entries = []
    for entry in layout.tensor_map:
        names = (entry,) if isinstance(entry, str) else tuple(entry or ())
        kept = tuple(a for a in names if a in mesh.alias_names)
        entries.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return TensorLayout(mesh, entries)


def _dataset_strategy(table: StrategyTable, mesh: Layout, example_inputs: Sequence):
    """One layout per model input, of the input's observed rank, as the simulation laid it out."""
    from mindspore import Tensor

    strategy = table.strategy
    if strategy.input_map is None and not strategy.data_axis:
        return "full_batch"
    out = []
    for x in example_inputs:
        if not isinstance(x, Tensor):
            continue
        layout, notes = strategy.input_layout(tuple(x.shape))
        if notes:
            why = strategy.input_split_error(tuple(x.shape)) or "; ".join(notes)
            raise ValueError(f"native mode: model input of shape {tuple(x.shape)} cannot be split as declared: {why}")
        out.append(_ms(_on_native_mesh(layout, mesh)))
    return tuple(out)


def _ms(layout: TensorLayout):
    entries = [NONE_ALIAS if e is None else e for e in layout.tensor_map]
    return layout.mesh.to_mindspore()(*entries)
