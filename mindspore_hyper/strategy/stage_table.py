"""One pipeline stage's StrategyTable, sliced from the job's: the strategy is resolved once per job.

A pipeline stage runs its parameters on the stage mesh: the job mesh without the pipeline axis
(every other axis keeps its size). The job's table already holds each parameter's layout on the
job mesh, and a pipelined strategy never splits a tensor along the pipeline axis (the pipeline
build refuses that), so a stage's layouts are the job's tensor maps re-read on the stage mesh.
Only ZeRO-1 along the pipeline axis itself has no meaning inside one stage: those optimizer
states follow their parameter there (as the stage's own strategy declares).
"""
from __future__ import annotations

import fnmatch
import math
from typing import Sequence

from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.shard.tensor_layout import TensorLayout
from mindspore_hyper.strategy.resolve import ParamRow, StrategyTable

__all__ = ["stage_table"]


def stage_table(table: StrategyTable, names: Sequence[str], stage_mesh: Layout, axis: str) -> StrategyTable:
    """The rows of parameters `names` of the job's `table`, laid out on `stage_mesh`.

    Args:
        table: the job's StrategyTable (its mesh has the pipeline axis `axis`).
        names: the stage's parameter names (as in the job's table).
        stage_mesh: the job mesh without `axis`: the other axes, same aliases and sizes.
        axis: the pipeline axis alias.

    Returns:
        A StrategyTable on `stage_mesh` whose strategy is the job's with the pipeline axis dropped
        (the overrides that match one of `names` kept); each row keeps the job's source and notes,
        its devices are the stage mesh's ranks, its optimizer bytes count `table.optimizer_states`.

    Raises:
        ValueError: `stage_mesh` is not the job mesh without `axis`, a name is not in `table`, or a
            layout splits along `axis` (each names the value).
    """
    job = table.mesh
    if axis not in job.alias_names:
        raise ValueError(f"stage_table: axis={axis!r} is not an axis of the job mesh {job.alias_names}")
    kept = tuple((a, job.axis_size(a)) for a in job.alias_names if a != axis)
    if tuple(zip(stage_mesh.alias_names, stage_mesh.device_matrix)) != kept:
        raise ValueError(f"stage_table: stage_mesh {stage_mesh} is not the job mesh {job} without axis {axis!r}")
    missing = [n for n in names if n not in table]
    if missing:
        raise ValueError(f"stage_table: parameters {missing} are not in the job's strategy table "
                         f"(it has {len(table)} parameters)")
    full = table.strategy
    rows = [_stage_row(table[n], stage_mesh, axis, full.optimizer_state == axis, table.optimizer_states)
            for n in names]
    overrides = {p: t for p, t in full.overrides.items() if any(fnmatch.fnmatchcase(n, p) for n in names)}
    context = full.context
    strategy = Strategy(stage_mesh, _without_axis(full.tensor_map, axis),
                        full.optimizer_state if full.optimizer_state != axis else None, full.data_axis,
                        full.input_map, overrides,
                        context_parallel=context and context.axis, context_method=context and context.method)
    return StrategyTable(rows, stage_mesh, strategy, optimizer_states=table.optimizer_states)


def _without_axis(tensor_map, axis: str) -> tuple:
    """A default tensor map with the pipeline axis `axis` removed (an entry naming only it becomes
    None). No parameter is split along it (checked above and by the pipeline build), so the map
    resolves the same on the stage mesh."""
    def drop(entry):
        if entry == axis:
            return None
        if isinstance(entry, tuple):
            kept = tuple(e for e in entry if e != axis)
            return kept if len(kept) > 1 else (kept[0] if kept else None)
        return entry

    return tuple(drop(e) for e in tensor_map)


def _stage_row(row: ParamRow, stage_mesh: Layout, axis: str, zero_on_axis: bool, optimizer_states: int) -> ParamRow:
    def on_stage(layout: TensorLayout, what: str) -> TensorLayout:
        if layout.mesh.axis_index(axis) in layout.sharded_axes():
            raise ValueError(f"stage_table: parameter {row.name!r}: its {what} {layout.tensor_map} splits along the "
                             f"pipeline axis {axis!r}; a stage's tensors live on one pipeline rank")
        return TensorLayout(stage_mesh, layout.tensor_map)

    layout = on_stage(row.layout, "layout")
    optimizer_layout = layout if zero_on_axis else on_stage(row.optimizer_layout, "optimizer layout")
    elements = math.prod(row.local_shape)
    itemsize = row.param_bytes // elements if elements else 0  # the row's dtype name is MindSpore's, not numpy's
    optimizer_bytes = math.prod(optimizer_layout.local_shape(row.global_shape)) * itemsize * optimizer_states
    return ParamRow(name=row.name, cell=row.cell, global_shape=row.global_shape, local_shape=layout.local_shape(
        row.global_shape), dtype=row.dtype, layout=layout, optimizer_layout=optimizer_layout,
        param_bytes=row.param_bytes, optimizer_bytes=optimizer_bytes, devices=tuple(stage_mesh.ranks),
        source=row.source, notes=row.notes)
