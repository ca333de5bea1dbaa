"""MPMD device groups in the job's StrategyTable: each group's rows resolved once, sliced per Cell.

A device group runs its Cells on a mesh of its own ranks with its own Strategy (data parallel by
default, or the user's `group_strategies[name]`), whose override patterns name parameters
relative to each Cell (`0.weight` for the Cell `vision_encoder`). `resolve_group` resolves the
group's Cells by that strategy once, at the MPMD build, into the job's table: each row keyed by
the group (`row.group`), under its full name, on the group's mesh, held by the group's global
ranks. A group's runtime then takes its Cells' slices (`group_slice`), as a pipeline stage takes
its slice of the job's table (stage_table.py); nothing resolves again until a device move gives
the group another mesh.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.strategy.resolve import StrategyTable, resolve_strategy

__all__ = ["resolve_group", "group_slice"]


def resolve_group(table: StrategyTable, network, group: str, cells: Sequence[str], strategy: Strategy,
                  ranks: Sequence[int], field: str) -> StrategyTable:
    """Resolve device group `group`'s Cells by its `strategy` into the job's `table`.

    Args:
        table: the job's StrategyTable (its rows of the group's parameters are replaced).
        network: the whole model (the Cells are looked up by name in it).
        group: the group's name.
        cells: names of the outermost Cells the group runs.
        strategy: the group's Strategy on a mesh of `len(ranks)` devices; its override patterns
            name parameters relative to each Cell.
        ranks: the global ranks the group runs on (local rank i of its mesh is `ranks[i]`).
        field: where the strategy was declared, named by errors (e.g. "group_strategies['vision']").

    Returns:
        `table`, holding the group's rows (`row.group == group`, full parameter names, layouts on
        the group's mesh, devices the group's global ranks); `table.group_strategies[group]` is
        `strategy`.

    Raises:
        ValueError: the strategy's mesh size is not `len(ranks)`, a Cell name is not in `network`,
            or the strategy does not fit a Cell's parameters (an override matching nothing, a
            layout that does not divide a shape); each names `field`, the group and the Cell.
    """
    if strategy.mesh.size != len(ranks):
        raise ValueError(f"{field}: mesh {strategy.mesh.device_matrix} has {strategy.mesh.size} devices but group "
                         f"{group!r} runs on {len(ranks)} ranks {list(ranks)}")
    named = dict(network.cells_and_names())
    rows = []
    for cell in cells:
        if cell not in named:
            raise ValueError(f"{field}: group {group!r} names Cell {cell!r}, which the model does not have")
        try:
            own = resolve_strategy(named[cell], strategy, optimizer_states=table.optimizer_states).check_shapes()
        except ValueError as exc:
            raise ValueError(f"{field} (group {group!r}, Cell {cell!r}, parameter names relative to it): "
                             f"{exc}") from None
        for row in own:
            full = f"{cell}.{row.name}"
            rows.append(replace(row, name=full, cell=full.rpartition(".")[0], group=group,
                                devices=tuple(ranks[r] for r in row.devices)))
    table.set_group_rows(group, strategy, ranks, rows, cells)
    return table


def group_slice(table: StrategyTable, group: str, cell: str) -> StrategyTable:
    """The rows of Cell `cell` of device group `group`, as the group's runtime runs them.

    Args:
        table: the job's StrategyTable holding the group's rows (`resolve_group`).
        group: the group's name.
        cell: one of the group's Cells.

    Returns:
        A StrategyTable on the group's mesh with the group's strategy: the Cell's parameters
        under names relative to it (as `cell.parameters_and_names()` gives them), held by the
        group mesh's ranks.

    Raises:
        ValueError: the table holds no rows of `group` (the group was not resolved into it).
    """
    strategy = table.group_strategies.get(group)
    if strategy is None:
        raise ValueError(f"group_slice: the strategy table holds no rows of device group {group!r} (groups "
                         f"resolved: {sorted(table.group_strategies)}); resolve_group it first")
    prefix = cell + "."
    local = {g: i for i, g in enumerate(table.group_ranks[group])}
    rows = []
    for row in table.group_rows(group):
        if row.name.startswith(prefix):
            name = row.name[len(prefix):]
            rows.append(replace(row, name=name, cell=name.rpartition(".")[0], group=None,
                                devices=tuple(local[r] for r in row.devices)))
    return StrategyTable(rows, strategy.mesh, strategy, optimizer_states=table.optimizer_states)
