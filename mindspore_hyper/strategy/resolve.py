"""`resolve_strategy(cell, config_or_strategy) -> StrategyTable`: where every parameter of a model lives.

The table is what the runtimes consume (simulation, msrun, native translation): for each
parameter its tensor layout on the mesh, global and local shape, dtype, the bytes each holding
device keeps for the parameter and for its optimizer states, the pipeline stage or device group
that holds it, and why (the deciding strategy entry). Pipeline stages are assigned here (see
`assign_pipeline_stages`).
"""
from __future__ import annotations

import difflib
import fnmatch
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from mindspore_hyper.strategy.config import (
    ConfigError, ModuleEntry, ParallelConfig, is_glob, load_parallel_config,
)
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.shard.tensor_layout import TensorLayout
from mindspore_hyper.strategy.process_groups import DeviceGroup
from mindspore_hyper.units import format_bytes, itemsize as dtype_size

__all__ = ["ParamRow", "StrategyTable", "resolve_strategy", "assign_pipeline_stages", "DEFAULT_OPTIMIZER_STATES"]

DEFAULT_OPTIMIZER_STATES = 2  # Adam / AdamWeightDecay keep two states (m, v) shaped like the parameter


@dataclass(frozen=True)
class ParamRow:
    """One parameter's placement.

    Attributes:
        name: the parameter name (as in `cell.parameters_and_names()`).
        cell: the name of the Cell that owns it ("" for the root).
        global_shape / local_shape: full shape and each holding device's shard shape.
        dtype: MindSpore dtype name, e.g. "Float32".
        layout: tensor layout of the parameter on the mesh.
        optimizer_layout: tensor layout of its optimizer states (ZeRO-1 adds the optimizer axis).
        param_bytes: bytes of the parameter shard on each device that holds it.
        optimizer_bytes: bytes of its optimizer states on each device that holds them.
        devices: the ranks that hold the parameter (all mesh ranks unless staged or grouped).
        stage: pipeline stage, or None without pipeline.
        group: name of the device group (mpmd entry / process group), or None.
        source: "default", the deciding override pattern, or the YAML path of the deciding entry.
        notes: adaptations and explanations (e.g. a dimension left unsharded).
    """

    name: str
    cell: str
    global_shape: Tuple[int, ...]
    local_shape: Tuple[int, ...]
    dtype: str
    layout: TensorLayout
    optimizer_layout: TensorLayout
    param_bytes: int
    optimizer_bytes: int
    devices: Tuple[int, ...]
    stage: Optional[int] = None
    group: Optional[str] = None
    source: str = "default"
    notes: Tuple[str, ...] = field(default=())

    @property
    def tensor_map(self) -> Tuple:
        return self.layout.tensor_map

    def to_dict(self) -> dict:
        return {
            "name": self.name, "cell": self.cell, "global_shape": list(self.global_shape),
            "local_shape": list(self.local_shape), "dtype": self.dtype,
            "tensor_map": [list(e) if isinstance(e, tuple) else e for e in self.layout.tensor_map],
            "ms_tensor_map": [list(e) if isinstance(e, tuple) else e for e in self.layout.ms_tensor_map],
            "optimizer_tensor_map": [list(e) if isinstance(e, tuple) else e for e in self.optimizer_layout.tensor_map],
            "param_bytes": self.param_bytes, "optimizer_bytes": self.optimizer_bytes,
            "devices": list(self.devices), "stage": self.stage, "group": self.group, "source": self.source,
            "notes": list(self.notes),
        }


class StrategyTable:
    """Per-parameter placements of one model under one strategy; iterable and indexable by name.

    Attributes:
        mesh: the device Layout.
        strategy: the Strategy that produced the layouts.
        config: the ParallelConfig, when resolved from one (else None).
        pipeline_stages: number of pipeline stages (1 = none).
        cell_stages: Cell name -> pipeline stage (the Cells the native runtime marks).
        groups: the device groups (mpmd entries, process groups).
        group_strategies: group name -> the Strategy (on the group's own mesh) its rows were
            resolved by, for each group whose rows `set_group_rows` put here (the MPMD build);
            empty until then (the rows of grouped parameters are then the config's, on the job mesh).
        group_ranks: group name -> the global ranks its mesh's ranks stand for (in mesh order).
        optimizer_states: optimizer states per parameter assumed for optimizer_bytes.
    """

    def __init__(self, rows: Sequence[ParamRow], mesh: Layout, strategy: Strategy,
                 config: Optional[ParallelConfig] = None, cell_stages: Optional[Dict[str, int]] = None,
                 optimizer_states: int = DEFAULT_OPTIMIZER_STATES):
        self._rows = list(rows)
        self._by_name = {r.name: r for r in self._rows}
        self.mesh = mesh
        self.strategy = strategy
        self.config = config
        self.cell_stages = dict(cell_stages or {})
        self.pipeline_stages = config.pipeline_stages if config is not None else 1
        self.groups: List[DeviceGroup] = list(config.groups) if config is not None else []
        self.group_strategies: Dict[str, Strategy] = {}
        self.group_ranks: Dict[str, Tuple[int, ...]] = {}
        self.optimizer_states = optimizer_states

    def __iter__(self) -> Iterator[ParamRow]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> ParamRow:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no parameter named {name!r}; parameters: {list(self._by_name)}") from None

    def names(self) -> List[str]:
        return [r.name for r in self._rows]

    def group_rows(self, group: str) -> List[ParamRow]:
        """The rows device group `group` holds (`row.group == group`), in table order."""
        return [r for r in self._rows if r.group == group]

    def set_group_rows(self, group: str, strategy: Strategy, ranks: Sequence[int], rows: Sequence[ParamRow],
                       cells: Sequence[str]) -> None:
        """Hold device group `group`'s rows (see strategy/group_table.py): they replace the
        group's earlier rows and the rows of the parameters under its `cells` (the config's rows
        on the job mesh), in place where a name was here, else at the end.

        Args:
            group: the group's name.
            strategy: the Strategy the rows were resolved by (its mesh is the group's).
            ranks: the global rank of each rank of the group's mesh, in mesh order.
            rows: the group's rows (full parameter names, `row.group == group`).
            cells: the names of the Cells the group runs.
        """
        new = {r.name: r for r in rows}
        under = tuple(c + "." for c in cells)
        kept = []
        for r in self._rows:
            if r.name in new:
                kept.append(new.pop(r.name))
            elif r.group != group and not r.name.startswith(under):
                kept.append(r)
        self._rows = kept + [r for r in rows if r.name in new]
        self._by_name = {r.name: r for r in self._rows}
        self.group_strategies[group] = strategy
        self.group_ranks[group] = tuple(ranks)

    def check_shapes(self) -> "StrategyTable":
        """Check every parameter's shape fits its layout (each split dimension divisible as the
        layout requires); returns the table, for chaining.

        Raises:
            ValueError: a parameter its layout cannot split (named by the layout's check).
        """
        for row in self._rows:
            row.layout.check_shape(row.global_shape)
        return self

    def bytes_per_device(self) -> Dict[int, Dict[str, int]]:
        """rank -> {"param": bytes, "optimizer": bytes} summed over the parameters each rank holds."""
        out = {rank: {"param": 0, "optimizer": 0} for rank in self.mesh.ranks}
        for row in self._rows:
            for rank in row.devices:
                out[rank]["param"] += row.param_bytes
                out[rank]["optimizer"] += row.optimizer_bytes
        return out

    def max_bytes_per_device(self) -> int:
        """The largest parameter + optimizer-state footprint of any device."""
        per = self.bytes_per_device()
        return max((v["param"] + v["optimizer"] for v in per.values()), default=0)

    def to_dict(self) -> dict:
        return {
            "mesh": self.mesh.to_dict(), "pipeline_stages": self.pipeline_stages,
            "optimizer_axis": self.strategy.optimizer_state, "data_axis": self.strategy.data_axis,
            "optimizer_states": self.optimizer_states, "cell_stages": dict(self.cell_stages),
            "groups": [g.to_dict() for g in self.groups],
            "group_meshes": {g: dict(s.mesh.to_dict(), ranks=list(self.group_ranks[g]))
                             for g, s in self.group_strategies.items()},
            "parameters": {r.name: r.to_dict() for r in self._rows},
        }

    def __str__(self) -> str:
        head = ["parameter", "global", "local", "dtype", "tensor_map", "where", "param/dev", "optim/dev", "source"]
        lines = []
        for r in self._rows:
            where = (f"group {r.group}" if r.group is not None else f"stage {r.stage}" if r.stage is not None
                     else "all")
            tmap = "(" + ", ".join(_entry_text(e) for e in r.layout.tensor_map) + ")"
            lines.append([r.name, _shape(r.global_shape), _shape(r.local_shape), r.dtype, tmap, where,
                          format_bytes(r.param_bytes, short=True), format_bytes(r.optimizer_bytes, short=True), r.source + (" *" if r.notes else "")])
        widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)] if lines else [len(h) for h in head]
        fmt = "  ".join("{:<%d}" % w for w in widths)
        out = [f"StrategyTable: mesh {self.mesh.device_matrix} {self.mesh.alias_names}, "
               f"{len(self._rows)} parameters, pipeline stages {self.pipeline_stages}, "
               f"optimizer axis {self.strategy.optimizer_state}", fmt.format(*head),
               fmt.format(*["-" * w for w in widths])]
        resolved = set(self.group_strategies)  # rows on a group's own mesh: under the group's heading
        out += [fmt.format(*line) for r, line in zip(self._rows, lines) if r.group not in resolved]
        for g, s in self.group_strategies.items():
            out.append(f"group {g}: tensor maps on its own mesh {s.mesh.device_matrix} {s.mesh.alias_names} "
                       f"(ranks {list(self.group_ranks[g])})")
            out += [fmt.format(*line) for r, line in zip(self._rows, lines) if r.group == g]
        notes = [(r.name, n) for r in self._rows for n in r.notes]
        if notes:
            out.append("notes (*):")
            out += [f"  {name}: {note}" for name, note in notes]
        out.append(f"max per device: {format_bytes(self.max_bytes_per_device(), short=True)} (parameters + optimizer states)")
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"StrategyTable({len(self._rows)} parameters, mesh={self.mesh.device_matrix})"


# -- resolution ----------------------------------------------------------------------------------

def resolve_strategy(cell, config_or_strategy: Union[Strategy, ParallelConfig, dict, str, os.PathLike],
                     optimizer_states: int = DEFAULT_OPTIMIZER_STATES) -> StrategyTable:
    """Resolve a strategy or parallel config against a model's parameters.

    Args:
        cell: the `mindspore.nn.Cell` (parameter names as in `cell.parameters_and_names()`).
        config_or_strategy: a Strategy, a ParallelConfig, or a YAML path / mapping for
            `load_parallel_config`.
        optimizer_states: optimizer states per parameter (2 for Adam's m and v, 1 for momentum
            SGD, 0 for plain SGD) used for `optimizer_bytes`.

    Returns:
        The StrategyTable.

    Raises:
        ValueError: an override, module_level or parameter_level pattern matches nothing in the
            model (the message lists the nearest names; opt out per pattern with
            `override(..., optional=True)` or `optional: true` in the YAML); an override does not
            divide a parameter's shape or has more entries than its rank. From a config these are
            ConfigError naming the YAML path.
        TypeError: `config_or_strategy` is of an unsupported type.

    Warns:
        UserWarning: a process-group `modules` pattern matches no Cell of the model.
    """
    if isinstance(config_or_strategy, Strategy):
        strategy, config = config_or_strategy, None
    elif isinstance(config_or_strategy, (ParallelConfig, dict, str, os.PathLike)):
        config = load_parallel_config(config_or_strategy)
        strategy = config.to_strategy()
    else:
        raise TypeError(f"resolve_strategy: expected a Strategy, ParallelConfig, YAML path or mapping, "
                        f"got {type(config_or_strategy).__name__}")
    if isinstance(optimizer_states, bool) or not isinstance(optimizer_states, int) or optimizer_states < 0:
        raise ValueError(f"optimizer_states={optimizer_states!r}: expected an int >= 0")

    params = list(cell.parameters_and_names())
    cell_names = [name for name, _ in cell.cells_and_names() if name]
    param_names = [name for name, _ in params]
    if config is None:
        _check_overrides(strategy, param_names)
        sources = {}
    else:
        _check_config_patterns(config, cell_names, param_names)
        sources = config.override_sources()

    cell_stages, param_stage = ({}, {})
    if config is not None and config.pipeline_stages > 1:
        cell_stages, param_stage = assign_pipeline_stages(cell, config)

    rows = []
    for name, param in params:
        shape = tuple(int(s) for s in param.shape)
        owner = name.rpartition(".")[0]
        pattern = strategy.matching_override(name)
        source = sources.get(pattern, pattern or "default") if config is not None else (pattern or "default")
        if config is not None and pattern is not None:
            _check_rank(config, sources.get(pattern), strategy.overrides[pattern], name, shape)
        try:
            placement = strategy.param_placement(name, shape)
        except ValueError as exc:
            if config is not None and pattern in sources:
                raise ConfigError(_split_path(config, sources[pattern]), str(exc)) from None
            raise
        notes = list(placement.notes)
        layout, opt_layout = placement.layout, placement.optimizer_layout
        group = config.group_of_module(owner) if config is not None else None
        itemsize = dtype_size(param.dtype)
        local = layout.local_shape(shape)
        param_bytes = math.prod(local) * itemsize
        opt_bytes = math.prod(opt_layout.local_shape(shape)) * itemsize * optimizer_states
        stage = None
        if group is not None:
            devices = group.ranks
            if strategy.optimizer_state is not None:
                opt_bytes, note = _group_optimizer_bytes(shape, group, param_bytes * optimizer_states)
                notes.append(note)
            opt_layout = layout
            notes.append(f"runs in device group {group.name!r} on {group.size} ranks ({group.kind})")
        elif name in param_stage:
            stage = param_stage[name]
            axis = config.pipeline_axis
            if config.mesh.axis_index(axis) in layout.sharded_axes():
                raise ValueError(f"parameter {name!r} is on pipeline stage {stage}, but its layout {layout.tensor_map} "
                                 f"(from {source}) shards along the pipeline axis {axis!r}")
            a = config.mesh.axis_index(axis)
            devices = tuple(r for r in config.mesh.ranks if config.mesh.coords(r)[a] == stage)
        else:
            devices = tuple(strategy.mesh.ranks)
        rows.append(ParamRow(name=name, cell=owner, global_shape=shape, local_shape=local, dtype=str(param.dtype),
                             layout=layout, optimizer_layout=opt_layout, param_bytes=param_bytes,
                             optimizer_bytes=opt_bytes, devices=tuple(devices), stage=stage,
                             group=None if group is None else group.name, source=source, notes=tuple(notes)))
    return StrategyTable(rows, strategy.mesh, strategy, config, cell_stages, optimizer_states)


def _check_overrides(strategy: Strategy, param_names: List[str]) -> None:
    optional = getattr(strategy, "optional_overrides", ())
    for pattern in strategy.overrides:
        hits = [n for n in param_names if fnmatch.fnmatchcase(n, pattern)]
        if hits or pattern in optional:
            continue
        if not is_glob(pattern):
            raise ValueError(f"override {pattern!r} names no parameter of the model; "
                             f"{nearest_names(pattern, param_names, 'parameter')}")
        raise ValueError(f"override pattern {pattern!r} matches no parameter of the model; "
                         f"{nearest_names(pattern, param_names, 'parameter')}; if it is meant for other models, "
                         f"add it with override(..., optional=True)")


def _check_config_patterns(config: ParallelConfig, cell_names: List[str], param_names: List[str]) -> None:
    optional = "; if the entry is meant for other models, mark it `optional: true`"
    for entry in config.modules:
        if not entry.optional and not any(fnmatch.fnmatchcase(c, entry.pattern) for c in cell_names):
            raise ConfigError(f"{entry.path}.name", f"pattern {entry.pattern!r} matches no Cell of the model; "
                                                    f"{nearest_names(entry.pattern, cell_names, 'Cell')}{optional}")
    for group in config.groups:
        if group.kind == "process_group" and not any(fnmatch.fnmatchcase(c, group.modules) for c in cell_names):
            warnings.warn(f"{group.path}: modules pattern {group.modules!r} matches no Cell of the model",
                          UserWarning, stacklevel=3)
    for entry in config.parameters:
        if entry.optional or any(fnmatch.fnmatchcase(n, entry.name) for n in param_names):
            continue
        what = "names" if entry.explicit else "matches"
        raise ConfigError(f"{entry.path}.name", f"{entry.name!r} {what} no parameter of the model; "
                                                f"{nearest_names(entry.name, param_names, 'parameter')}{optional}")


def nearest_names(pattern: str, names: Sequence[str], what: str, count: int = 5) -> str:
    """"nearest <what> names: ..." for a pattern that matched nothing: the model's names closest to
    it, numbered indices folded into `*` (`layers.0.attn`, `layers.1.attn` -> `layers.*.attn`, a
    pattern the user can paste), or the model's having none."""
    if not names:
        return f"the model has no {what}s"
    folded = list(dict.fromkeys(re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", n) for n in names))
    bare = pattern.replace("*", "").replace("?", "")
    ranked = sorted(folded, key=lambda n: -difflib.SequenceMatcher(None, bare, n.replace("*", "")).ratio())
    return f"nearest {what} names: {', '.join(ranked[:count])}"


def _entry_for(config: ParallelConfig, path: str) -> Optional[ModuleEntry]:
    for entry in config.modules:
        if entry.path == path:
            return entry
    return None


def _split_path(config: ParallelConfig, path: str) -> str:
    entry = _entry_for(config, path)
    if entry is not None and entry.kind == "spmd":
        return entry.split_path()
    if path.startswith("parallel_config.parameter_level"):
        return f"{path}.tensor_map"
    return path


def _check_rank(config: ParallelConfig, path: Optional[str], tmap: Tuple, name: str, shape: Tuple[int, ...]) -> None:
    """A config entry whose tensor map needs more dimensions than the parameter has -> ConfigError at its path."""
    entry = _entry_for(config, path) if path else None
    if entry is not None and entry.kind == "spmd" and entry.required_rank() > len(shape):
        counts = ", ".join(f"{k}: ({','.join(map(str, v))})" for k, v in entry.splits.items())
        leaf = name.rpartition(".")[2]
        fix = "[None]" if len(shape) == 1 else "[" + ", ".join(["None"] * len(shape)) + "]"
        raise ConfigError(entry.split_path(), f"{{{counts}}} splits dimension {entry.required_rank() - 1}, but "
                                              f"parameter {name!r} of Cells matching {entry.pattern!r} has shape "
                                              f"{shape} ({len(shape)} dimensions). To keep it replicated (a "
                                              f"row-parallel layer's bias is added after the partial sums are "
                                              f"reduced), add a parameter_level entry, which wins over module_level: "
                                              f"parameter_level: [{{name: \"{entry.pattern}.{leaf}\", "
                                              f"tensor_map: {fix}}}] (as configs/tensor_parallel_8.yaml does)")
    if path and path.startswith("parallel_config.parameter_level") and len(tmap) > len(shape):
        raise ConfigError(f"{path}.tensor_map", f"{len(tmap)} entries but parameter {name!r} has shape {shape} "
                                                f"({len(shape)} dimensions)")


def _group_optimizer_bytes(shape: Tuple[int, ...], group: DeviceGroup, full: int) -> Tuple[int, str]:
    for dim, size in enumerate(shape):
        if size % group.size == 0:
            return full // group.size, (f"optimizer states sharded over the {group.size} ranks of group "
                                        f"{group.name!r} along dimension {dim}")
    return full, f"optimizer states not sharded in group {group.name!r}: no dimension divides by {group.size}"


# -- pipeline stages -----------------------------------------------------------------------------

def assign_pipeline_stages(cell, config: ParallelConfig) -> Tuple[Dict[str, int], Dict[str, int]]:
    """Assign Cells and parameters to `config.pipeline_stages` contiguous pipeline stages.

    Rule: the units are the maximal Cells matched by a module_level entry that has `pipeline`
    (a matched Cell inside another matched Cell is not a unit), in model order, excluding Cells
    of device groups. While there are fewer units than stages, each unit with sub-Cells holding
    parameters is replaced by those sub-Cells (parameters it owns itself, as a converted model's Cell
    holds its embedding table, then follow the rule for other Cells below). The units are cut into `pipeline_stages`
    contiguous non-empty runs minimising the largest run's parameter bytes. Every other
    parameter-owning Cell takes the stage of the nearest unit before it (stage 0 if none).

    Returns:
        (Cell name -> stage for the Cells to mark, parameter name -> stage).

    Raises:
        ConfigError: fewer parameter-holding Cells than stages (names the entry's pipeline path).
    """
    n = config.pipeline_stages
    entries = [e for e in config.modules if e.kind == "spmd" and e.pipeline is not None]
    cells = [(name, c) for name, c in cell.cells_and_names() if name]
    sizes = {}
    params = list(cell.parameters_and_names())
    for pname, p in params:
        nbytes = math.prod(int(s) for s in p.shape) * dtype_size(p.dtype)
        parts = pname.split(".")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            sizes[prefix] = sizes.get(prefix, 0) + nbytes

    def matched(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, e.pattern) for e in entries) and config.group_of_module(name) is None

    units: List[str] = []
    for name, _ in cells:
        if matched(name) and not any(name.startswith(u + ".") for u in units) and sizes.get(name, 0) > 0:
            units.append(name)
    children = {name: [c for c, _ in cells if c.startswith(name + ".") and "." not in c[len(name) + 1:]]
                for name, _ in cells}
    while 0 < len(units) < n:
        expanded: List[str] = []
        for u in units:  # a unit's own parameters (a converted Cell's embedding table) go with the unit before
            kids = [k for k in children.get(u, []) if sizes.get(k, 0) > 0]
            expanded += kids or [u]
        if expanded == units:
            break
        units = expanded
    if len(units) < n:
        where = f"{entries[0].path}.strategy.pipeline" if entries else "parallel_config.module_level"
        raise ConfigError(where, f"{n} pipeline stages, but only {len(units)} parameter-holding Cells match "
                                 f"{[e.pattern for e in entries]}: {units}")
    stage_of_unit = dict(zip(units, _partition([sizes[u] for u in units], n)))

    cell_stages: Dict[str, int] = dict(stage_of_unit)
    current = 0
    owners = {pn.rpartition(".")[0] for pn, _ in params}
    for name, _ in cells:
        unit = next((u for u in units if name == u or name.startswith(u + ".")), None)
        if unit is not None:
            current = stage_of_unit[unit]
            continue
        if name in owners and config.group_of_module(name) is None:
            cell_stages[name] = current
    param_stage: Dict[str, int] = {}
    for pname, _ in params:
        owner = pname.rpartition(".")[0]
        if config.group_of_module(owner) is not None:
            continue
        unit = next((u for u in units if owner == u or owner.startswith(u + ".")), None)
        if unit is not None:
            param_stage[pname] = stage_of_unit[unit]
        elif owner in cell_stages:
            param_stage[pname] = cell_stages[owner]
        else:
            param_stage[pname] = 0  # a parameter of the root Cell
    return cell_stages, param_stage


def _partition(weights: List[int], n: int) -> List[int]:
    """Stage index per item: n contiguous non-empty runs minimising the largest run sum."""
    m = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (m + 1) for _ in range(n + 1)]
    cut = [[0] * (m + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for k in range(1, n + 1):
        for j in range(k, m + 1):
            for i in range(k - 1, j):
                cost = max(best[k - 1][i], prefix[j] - prefix[i])
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    stages, j = [0] * m, m
    for k in range(n, 0, -1):
        i = cut[k][j]
        for t in range(i, j):
            stages[t] = k - 1
        j = i
    return stages


def _entry_text(entry) -> str:
    if entry is None:
        return "None"
    return entry if isinstance(entry, str) else "(" + ",".join(entry) + ")"


def _shape(shape: Sequence[int]) -> str:
    return "(" + ",".join(str(s) for s in shape) + ")"


