"""Where each MPMD device group runs: its Cells, its ranks and its own strategy (data only).

`place_groups(network, config)` matches every device group of a ParallelConfig (process_groups
and `strategy: mpmd` entries) to the outermost Cells its `modules` pattern names. A group runs
on a mesh of its own ranks: by default data parallel over them (batch split, parameters
replicated, optimizer states split when `optimizer.sharding` is on); an explicit Strategy per
group may replace that (e.g. tensor parallel inside the group).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from mindspore import nn

from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.strategy.config import ParallelConfig
from mindspore_hyper.strategy.group_table import resolve_group
from mindspore_hyper.strategy.process_groups import DeviceGroup
from mindspore_hyper.strategy.resolve import StrategyTable

__all__ = ["GroupPlacement", "place_groups", "resolve_placements", "data_parallel_strategy",
           "check_unshared_parameters"]


def data_parallel_strategy(size: int, optimizer_sharding: bool) -> Strategy:
    """Data parallelism over `size` devices: batch split, parameters replicated, optimizer
    states split over the devices when `optimizer_sharding`."""
    mesh = Layout([size], ["data"])
    return Strategy(mesh, tensor_map=(), optimizer_state="data" if optimizer_sharding and size > 1 else None,
                    data_axis="data")


@dataclass(frozen=True)
class GroupPlacement:
    """One device group as the MPMD runtime runs it.

    Attributes:
        group: the parsed DeviceGroup (name, YAML path, scheduler, batch_size).
        ranks: the global ranks the group runs on now (rebalancing may change them).
        cells: names of the outermost Cells the group runs, in model order.
        strategy: the group's strategy on a mesh of len(ranks) devices.
        explicit: True when the strategy was given by the user (never re-sharded by rebalancing).
    """

    group: DeviceGroup
    ranks: Tuple[int, ...]
    cells: Tuple[str, ...]
    strategy: Strategy
    explicit: bool = False

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def strategy_field(self) -> str:
        """Where the group's strategy comes from, as errors name it."""
        if self.explicit:
            return f"group_strategies[{self.name!r}]"
        return f"{self.group.path} (data parallel over its {self.size} ranks)"

    def resolve_into(self, table: StrategyTable, network: nn.Cell) -> None:
        """Resolve the group's Cells by its strategy into the job's `table` (see `resolve_group`)."""
        resolve_group(table, network, self.name, self.cells, self.strategy, self.ranks, self.strategy_field)

    def held_by(self, table: StrategyTable) -> bool:
        """Whether `table` holds the group's rows as this placement runs them (its strategy and ranks)."""
        return table.group_strategies.get(self.name) is self.strategy and table.group_ranks.get(self.name) == self.ranks

    def with_ranks(self, ranks: Sequence[int], optimizer_sharding: bool) -> "GroupPlacement":
        """The same group re-sharded data parallel over `ranks`."""
        if self.explicit:
            raise ValueError(f"group {self.name!r} has an explicit strategy; only data-parallel groups can "
                             "change their device count")
        ranks = tuple(sorted(ranks))
        return replace(self, ranks=ranks, strategy=data_parallel_strategy(len(ranks), optimizer_sharding))


def _outermost_matches(cell_names: Sequence[str], pattern: str) -> List[str]:
    hits = [c for c in cell_names if c and fnmatch.fnmatchcase(c, pattern)]
    return [c for c in hits if not any(c.startswith(h + ".") for h in hits if h != c)]


def place_groups(network: nn.Cell, config: ParallelConfig,
                 strategies: Optional[Mapping[str, Strategy]] = None,
                 colocated: Optional[Mapping[str, str]] = None) -> List[GroupPlacement]:
    """Match the config's device groups to the network's Cells and give each its strategy.

    Args:
        network: the model.
        config: a ParallelConfig with at least one device group.
        strategies: optional explicit Strategy per group name; its mesh must have as many
            devices as the group has ranks.
        colocated: optional Cell name -> group name: Cells no group pattern names that run on
            (time-share) that group's devices, e.g. an RLHF reference model on the actor's.

    Returns:
        One GroupPlacement per group, in config order.

    Raises:
        ValueError: a group matching no Cell, a Cell claimed by two groups (nested or
            overlapping patterns), a parameter outside every group, an unknown group name or a
            strategy of the wrong size in `strategies`.
    """
    strategies = dict(strategies or {})
    colocated = dict(colocated or {})
    names = {g.name for g in config.groups}
    for name in strategies:
        if name not in names:
            raise ValueError(f"group_strategies: {name!r} is not a device group; groups: {sorted(names)}")
    cell_names = [n for n, _ in network.cells_and_names()]
    for cell, name in colocated.items():
        if name not in names:
            raise ValueError(f"colocated[{cell!r}]: {name!r} is not a device group; groups: {sorted(names)}")
        if cell not in cell_names:
            raise ValueError(f"colocated: {cell!r} is not a Cell of the model")
    owner: Dict[str, str] = {}
    placements = []
    for group in config.groups:
        cells = _outermost_matches(cell_names, group.modules)
        cells += [c for c, name in colocated.items() if name == group.name and c not in cells]
        if not cells:
            raise ValueError(f"{group.path}: modules pattern {group.modules!r} matches no Cell of the model; "
                             f"Cells: {[c for c in cell_names if c][:20]}")
        for cell in cells:
            for other_cell, other in owner.items():
                if cell == other_cell or cell.startswith(other_cell + ".") or other_cell.startswith(cell + "."):
                    raise ValueError(f"{group.path}: Cell {cell!r} is also run by group {other!r} (Cell "
                                     f"{other_cell!r}); a Cell belongs to one device group")
            owner[cell] = group.name
        strategy = strategies.get(group.name)
        if strategy is not None and strategy.mesh.size != group.size:
            raise ValueError(f"group_strategies[{group.name!r}]: mesh {strategy.mesh.device_matrix} has "
                             f"{strategy.mesh.size} devices but group {group.name!r} has {group.size} ranks "
                             f"({group.ranks_path})")
        placements.append(GroupPlacement(
            group=group, ranks=group.ranks, cells=tuple(cells),
            strategy=strategy or data_parallel_strategy(group.size, config.optimizer_sharding is not None),
            explicit=strategy is not None))
    for name, _ in network.parameters_and_names():
        if not any(name.startswith(cell + ".") for cell in owner):
            raise ValueError(f"parameter {name!r} belongs to no device group: under hyper_mpmd every Cell with "
                             f"parameters runs in a group; add it to process_groups (modules: <pattern>) or to a "
                             f"module_level entry with strategy: mpmd")
    return placements


def resolve_placements(table: StrategyTable, network: nn.Cell, placements: Sequence[GroupPlacement]) -> StrategyTable:
    """The job's `table` holding every group's rows, each resolved once on the group's own mesh
    (the groups' runtimes take their slices, `group_slice`); returns `table`.

    Raises:
        ValueError: a group's strategy that does not fit its Cells' parameters (naming the group's
            strategy field, the group and the Cell).
    """
    for placement in placements:
        placement.resolve_into(table, network)
    return table


def check_unshared_parameters(network: nn.Cell, placements: Sequence[GroupPlacement]) -> None:
    """Refuse a Parameter used by Cells of two groups where the groups run in their own processes
    (msrun): each group's processes would update their own copy with their own part of its
    gradient (in one process the copies are one Parameter and autograd sums both uses).

    Raises:
        ValueError: naming the parameter, both groups and their Cells.
    """
    cells = dict(network.cells_and_names())
    owner: Dict[int, Tuple[str, str]] = {}
    for placement in placements:
        for cell_name in placement.cells:
            for param in cells[cell_name].trainable_params():
                first = owner.setdefault(id(param), (placement.name, cell_name))
                if first[0] != placement.name:
                    raise ValueError(f"parameter {param.name!r} is used by group {first[0]!r} (Cell {first[1]!r}) and "
                                     f"group {placement.name!r} (Cell {cell_name!r}): under msrun each group's "
                                     "processes would update their own copy; give the Cells their own Parameters, "
                                     "put them in one group, or run in simulation")
