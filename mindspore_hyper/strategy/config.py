"""YAML parallel config: `load_parallel_config(path_or_dict) -> ParallelConfig`.

The schema (full reference with the mapping semantics in docs/config.md)::

    parallel_config:
      device_matrix: [8, 2, 4]               # optional; inferred when absent (see below)
      alias_names: [data, tensor, pipeline]
      device_num: 64                          # optional; checks/infers the mesh size
      data_axis: data                         # optional; default "data" if the mesh has it
      pipeline_axis: pipeline                 # optional; default "pipeline"
      tensor_map: [None, None]                # optional default map for every parameter
      input_map: [data]                       # optional map for model inputs
      context_parallel: {axis: cp, method: ring}   # optional; method ring (default) or ulysses
      optimizer: {sharding: True, offload: False}
      module_level:
        - name: transformer.*                 # Cell-name pattern (fnmatch)
          strategy: {tensor: (2,1), pipeline: 4}
        - name: expert_layer
          strategy: mpmd
          devices: [0-63]
      parameter_level:                        # optional, explicit per-parameter maps
        - {name: head.weight, tensor_map: [tensor, None]}
        - {name: "*.lora_*", tensor_map: [tensor], optional: true}   # may match nothing
    process_groups:                           # optional, the multimodal example
      text_encoder: {ranks: [0-127], hardware: NPU, batch_size: 32}
    scheduler: dynamic                        # optional default scheduler of the groups

Every validation error is a `ConfigError` (a ValueError) whose message starts with the YAML path
of the bad field. Checks that need the model (a strategy longer than a parameter's rank, a
pattern that matches nothing) happen in `resolve_strategy`.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from mindspore_hyper.shard.layout import NONE_ALIAS, Layout
from mindspore_hyper.strategy.config_mesh import config_mesh
from mindspore_hyper.strategy.process_groups import (
    SCHEDULERS, ConfigError, DeviceGroup, check_disjoint, check_within, parse_process_groups, parse_ranks,
)
from mindspore_hyper.shard.context_parallel_spec import ContextParallel
from mindspore_hyper.shard.model_strategy import Strategy

__all__ = ["ParallelConfig", "ModuleEntry", "ParameterEntry", "ConfigError", "load_parallel_config",
           "parse_split_tuple", "is_glob"]

TOP_KEYS = ("parallel_config", "process_groups", "scheduler")
CONFIG_KEYS = ("device_matrix", "alias_names", "device_num", "data_axis", "pipeline_axis", "tensor_map",
               "input_map", "context_parallel", "optimizer", "module_level", "parameter_level")
CONTEXT_KEYS = ("axis", "method")
OPTIMIZER_KEYS = ("sharding", "offload")
MODULE_KEYS = ("name", "strategy", "devices", "optional")
PARAMETER_KEYS = ("name", "tensor_map", "optional")
MPMD = "mpmd"

_TUPLE_RE = re.compile(r"^\(?\s*(\d+\s*(?:,\s*\d+\s*)*),?\s*\)?$")


def is_glob(pattern: str) -> bool:
    """True when `pattern` has fnmatch wildcards (otherwise it names one thing exactly)."""
    return any(c in pattern for c in "*?[")


@dataclass(frozen=True)
class ModuleEntry:
    """One `module_level` entry.

    Attributes:
        pattern: Cell-name pattern (fnmatch, `*` also crosses dots).
        path: YAML path, e.g. "parallel_config.module_level[0]".
        kind: "spmd" (a strategy mapping) or "mpmd" (its own device group).
        splits: mesh alias -> per-dimension split counts, e.g. {"tensor": (2, 1)}.
        pipeline: number of pipeline stages requested, or None.
        devices: the ranks of an mpmd entry.
        tensor_map: the parameter tensor map the splits mean (trailing unsplit dims dropped).
        optional: `optional: true` in the YAML: the pattern may match no Cell (a config shared by
            several models); otherwise that is an error naming the nearest Cells.
    """

    pattern: str
    path: str
    kind: str
    splits: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
    pipeline: Optional[int] = None
    devices: Tuple[int, ...] = ()
    tensor_map: Tuple = ()
    optional: bool = False

    @property
    def param_pattern(self) -> str:
        """The parameter-name pattern of the parameters of matching Cells (and their sub-Cells)."""
        return module_param_pattern(self.pattern)

    def required_rank(self) -> int:
        """The smallest parameter rank the splits fit: the position of the last split count > 1, plus 1."""
        return len(self.tensor_map)

    def split_path(self) -> str:
        """YAML path of the split tuple(s), for messages."""
        keys = list(self.splits)
        return f"{self.path}.strategy.{keys[0]}" if len(keys) == 1 else f"{self.path}.strategy"


@dataclass(frozen=True)
class ParameterEntry:
    """One `parameter_level` entry: an explicit tensor map for parameters named `name`
    (`optional`: it may match no parameter of the model)."""

    name: str
    tensor_map: Tuple
    path: str
    optional: bool = False

    @property
    def explicit(self) -> bool:
        """An exact parameter name (no wildcards): it must exist in the model."""
        return not is_glob(self.name)


def module_param_pattern(module_pattern: str) -> str:
    """Parameter-name pattern for the parameters owned by Cells matching `module_pattern`.

    A parameter named "a.b.weight" belongs to the Cells "a.b" and "a"; fnmatch("a.b.weight", P + ".*")
    holds exactly when some dotted prefix of the name matches P.
    """
    return module_pattern + ".*"


@dataclass
class ParallelConfig:
    """A validated parallel config, ready for `to_strategy()` and `resolve_strategy`.

    Attributes:
        mesh: the device Layout (explicit or inferred, see `mesh_inferred`).
        mesh_inferred: True when the mesh was derived from the strategies and device count.
        data_axis: alias splitting the batch of inputs, or None.
        pipeline_axis: alias whose coordinate is the pipeline stage.
        pipeline_stages: number of pipeline stages (1 = no pipeline).
        tensor_map: default parameter tensor map.
        input_map: tensor map of model inputs, or None (batch on data_axis).
        context_parallel: the context-parallel axis and method, or None.
        optimizer_sharding: alias along which optimizer states are sharded, or None.
        optimizer_offload: whether optimizer states go to host memory (read by the offload runtime).
        modules: module_level entries, in file order.
        parameters: parameter_level entries, in file order.
        groups: device groups: mpmd entries and process_groups.
        scheduler: default scheduler of the groups ("static" or "dynamic").
        source: the file the config came from, if any.
    """

    mesh: Layout
    mesh_inferred: bool = False
    data_axis: Optional[str] = None
    pipeline_axis: str = "pipeline"
    pipeline_stages: int = 1
    tensor_map: Tuple = ()
    input_map: Optional[Tuple] = None
    context_parallel: Optional[ContextParallel] = None
    optimizer_sharding: Optional[str] = None
    optimizer_offload: bool = False
    modules: List[ModuleEntry] = field(default_factory=list)
    parameters: List[ParameterEntry] = field(default_factory=list)
    groups: List[DeviceGroup] = field(default_factory=list)
    scheduler: str = "static"
    source: Optional[str] = None

    def override_sources(self) -> Dict[str, str]:
        """Strategy override pattern -> YAML path of the entry that produced it (last one wins)."""
        out: Dict[str, str] = {}
        for pattern, path, _ in self._override_items():
            out.pop(pattern, None)
            out[pattern] = path
        return out

    def _override_items(self) -> List[Tuple[str, str, Tuple]]:
        items = []
        for entry in self.modules:
            items.append((entry.param_pattern, entry.path, entry.tensor_map if entry.kind == "spmd" else ()))
        for group in self.groups:
            if group.kind == "process_group":
                items.append((module_param_pattern(group.modules), group.path, ()))
        for entry in self.parameters:
            items.append((entry.name, entry.path, entry.tensor_map))
        return items

    def to_strategy(self) -> Strategy:
        """The model-wide Strategy: default map, optimizer axis, inputs, overrides in precedence order.

        Overrides, last match wins: module_level entries in file order (`P` becomes the parameter
        pattern `P.*`; mpmd entries map to a replicated layout), then process_groups (replicated
        inside their group), then parameter_level entries.
        """
        overrides: Dict[str, Tuple] = {}
        for pattern, _, tmap in self._override_items():
            overrides.pop(pattern, None)
            overrides[pattern] = tmap
        context = self.context_parallel
        try:
            return Strategy(self.mesh, tensor_map=self.tensor_map, optimizer_state=self.optimizer_sharding,
                            data_axis=self.data_axis, input_map=self.input_map, overrides=overrides,
                            context_parallel=context and context.axis, context_method=context and context.method)
        except ValueError as exc:
            if context is None or "context" not in str(exc):
                raise
            raise ConfigError("parallel_config.context_parallel", str(exc)) from None

    def group_of_module(self, cell_name: str) -> Optional[DeviceGroup]:
        """The device group running Cell `cell_name` (the last matching group), or None."""
        found = None
        for group in self.groups:
            if _cell_matches(cell_name, group.modules):
                found = group
        return found

    def to_dict(self) -> dict:
        return {
            "mesh": self.mesh.to_dict(), "mesh_inferred": self.mesh_inferred, "data_axis": self.data_axis,
            "pipeline_axis": self.pipeline_axis, "pipeline_stages": self.pipeline_stages,
            "tensor_map": list(self.tensor_map), "input_map": None if self.input_map is None else list(self.input_map),
            "context_parallel": None if self.context_parallel is None else {"axis": self.context_parallel.axis,
                                                                            "method": self.context_parallel.method},
            "optimizer": {"sharding": self.optimizer_sharding, "offload": self.optimizer_offload},
            "module_level": [{"name": m.pattern, "kind": m.kind, "splits": {k: list(v) for k, v in m.splits.items()},
                              "pipeline": m.pipeline, "devices": list(m.devices), "tensor_map": list(m.tensor_map)}
                             for m in self.modules],
            "parameter_level": [{"name": p.name, "tensor_map": list(p.tensor_map)} for p in self.parameters],
            "groups": [g.to_dict() for g in self.groups], "scheduler": self.scheduler, "source": self.source,
        }


def _cell_matches(cell_name: str, pattern: str) -> bool:
    """A Cell matches a module pattern when its name, or the name of a Cell containing it, matches."""
    parts = cell_name.split(".")
    return any(fnmatch.fnmatchcase(".".join(parts[:i]), pattern) for i in range(1, len(parts) + 1))


# -- loading -------------------------------------------------------------------------------------

def load_parallel_config(path_or_dict: Union[str, os.PathLike, dict, "ParallelConfig"]) -> ParallelConfig:
    """Load and validate a parallel config.

    Args:
        path_or_dict: a YAML file path, the parsed mapping (top-level keys `parallel_config`,
            `process_groups`, `scheduler`), or an already loaded ParallelConfig (returned as is).

    Returns:
        The validated ParallelConfig.

    Raises:
        ConfigError: a bad field; the message starts with its YAML path.
        FileNotFoundError: the path does not exist.
    """
    if isinstance(path_or_dict, ParallelConfig):
        return path_or_dict
    source = None
    if isinstance(path_or_dict, (str, os.PathLike)):
        import yaml

        source = os.fspath(path_or_dict)
        with open(source, "r", encoding="utf-8") as f:
            try:
                raw = yaml.safe_load(f)
            except yaml.YAMLError as exc:
                raise ConfigError(source, f"not valid YAML: {exc}") from None
    else:
        raw = path_or_dict
    if not isinstance(raw, dict):
        raise ConfigError("<root>", f"expected a mapping with keys {TOP_KEYS}, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        raise ConfigError(str(unknown[0]), f"unknown top-level key; expected one of {TOP_KEYS}")
    if "parallel_config" not in raw and "process_groups" not in raw:
        raise ConfigError("<root>", "expected 'parallel_config' and/or 'process_groups'")
    config = _Loader(raw).load()
    config.source = source
    return config


class _Loader:
    def __init__(self, raw: dict):
        self.raw = raw
        pc = raw.get("parallel_config", {})
        if pc is None:
            pc = {}
        if not isinstance(pc, dict):
            raise ConfigError("parallel_config", f"expected a mapping with keys {CONFIG_KEYS}")
        unknown = [k for k in pc if k not in CONFIG_KEYS]
        if unknown:
            raise ConfigError(f"parallel_config.{unknown[0]}", f"unknown key; expected one of {CONFIG_KEYS}")
        self.pc = pc

    def load(self) -> ParallelConfig:
        pc = self.pc
        scheduler = self.raw.get("scheduler", "static")
        if scheduler not in SCHEDULERS:
            raise ConfigError("scheduler", f"{scheduler!r}; expected one of {SCHEDULERS}")
        pipeline_axis = pc.get("pipeline_axis", "pipeline")
        if not isinstance(pipeline_axis, str) or not pipeline_axis:
            raise ConfigError("parallel_config.pipeline_axis", f"{pipeline_axis!r}; expected a mesh alias")

        raw_modules = self._raw_modules(pipeline_axis)
        groups: List[DeviceGroup] = [
            DeviceGroup(name=m["name"], ranks=m["devices"], modules=m["name"], path=m["path"],
                        scheduler=scheduler, kind="mpmd")
            for m in raw_modules if m["kind"] == "mpmd"
        ]
        if "process_groups" in self.raw:
            groups += parse_process_groups(self.raw["process_groups"], scheduler)
        check_disjoint(groups)

        mesh, inferred, mesh_text = config_mesh(pc, raw_modules, groups, pipeline_axis)
        for group in groups:
            check_within(group, mesh.size, mesh_text)

        data_axis = pc.get("data_axis", "data" if "data" in mesh.alias_names else None)
        if data_axis is not None:
            self._alias(mesh, data_axis, "parallel_config.data_axis")

        pipeline_stages = 1
        modules = []
        for m in raw_modules:
            entry = self._module_entry(m, mesh, pipeline_axis)
            if entry.pipeline is not None:
                pipeline_stages = entry.pipeline
            modules.append(entry)
        if pipeline_stages > 1:
            for entry in modules:
                if pipeline_axis in entry.splits and max(entry.splits[pipeline_axis]) > 1:
                    raise ConfigError(f"{entry.path}.strategy.{pipeline_axis}",
                                      f"axis {pipeline_axis!r} holds the {pipeline_stages} pipeline stages; it cannot "
                                      "also split parameters")

        tensor_map = self._tensor_map(pc.get("tensor_map", ()), mesh, "parallel_config.tensor_map")
        if pipeline_stages > 1 and any(pipeline_axis in _aliases_of(e) for e in tensor_map):
            raise ConfigError("parallel_config.tensor_map", f"uses axis {pipeline_axis!r}, which holds the pipeline "
                                                            "stages; it cannot also split parameters")
        input_map = None
        if pc.get("input_map") is not None:
            input_map = self._tensor_map(pc["input_map"], mesh, "parallel_config.input_map")

        context = self._context_parallel(mesh)
        sharding, offload = self._optimizer(mesh, data_axis)
        parameters = self._parameters(mesh)
        return ParallelConfig(mesh=mesh, mesh_inferred=inferred, data_axis=data_axis, pipeline_axis=pipeline_axis,
                              pipeline_stages=pipeline_stages, tensor_map=tensor_map, input_map=input_map,
                              context_parallel=context,
                              optimizer_sharding=sharding, optimizer_offload=offload, modules=modules,
                              parameters=parameters, groups=groups, scheduler=scheduler)

    def _named_entries(self, key: str, allowed: Sequence[str], shape: str, name_hint: str):
        """Yield (yaml path, mapping, name) for each entry of the list `parallel_config.<key>`,
        checking it is a list of mappings with known keys and a non-empty `name`."""
        raw = self.pc.get(key, []) or []
        if not isinstance(raw, list):
            raise ConfigError(f"parallel_config.{key}", f"expected a list of {shape} entries")
        for i, item in enumerate(raw):
            path = f"parallel_config.{key}[{i}]"
            if not isinstance(item, dict):
                raise ConfigError(path, f"expected a mapping with keys {allowed}, got {item!r}")
            unknown = [k for k in item if k not in allowed]
            if unknown:
                raise ConfigError(f"{path}.{unknown[0]}", f"unknown key; expected one of {allowed}")
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{path}.name", f"{name!r}; expected {name_hint}")
            yield path, item, name

    # -- module_level ------------------------------------------------------------------------
    def _raw_modules(self, pipeline_axis: str) -> List[dict]:
        out = []
        for path, item, name in self._named_entries("module_level", MODULE_KEYS, "{name, strategy[, devices]}",
                                                    "a Cell-name pattern such as 'transformer.*'"):
            if "strategy" not in item:
                raise ConfigError(f"{path}.strategy", "missing; expected a mapping like {tensor: (2,1)} or 'mpmd'")
            strategy = item["strategy"]
            optional = _optional(item, path)
            if strategy == MPMD:
                if "devices" not in item:
                    raise ConfigError(f"{path}.devices", "missing; an mpmd entry needs devices like [0-63]")
                out.append({"name": name, "path": path, "kind": "mpmd", "optional": optional,
                            "devices": parse_ranks(item["devices"], f"{path}.devices")})
                continue
            if "devices" in item:
                raise ConfigError(f"{path}.devices", "only an entry with 'strategy: mpmd' takes devices")
            if not isinstance(strategy, dict) or not strategy:
                raise ConfigError(f"{path}.strategy", f"{strategy!r}; expected a mapping like "
                                                      "{tensor: (2,1), pipeline: 4} or the string 'mpmd'")
            splits, pipeline = {}, None
            for key, value in strategy.items():
                where = f"{path}.strategy.{key}"
                if not isinstance(key, str):
                    raise ConfigError(where, "expected a mesh alias or 'pipeline' as key")
                if key == "pipeline" and not isinstance(value, (str, list, tuple)):
                    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                        raise ConfigError(where, f"{value!r}; expected a positive int number of pipeline stages")
                    pipeline = value
                    continue
                splits[key] = parse_split_tuple(value, where)
            out.append({"name": name, "path": path, "kind": "spmd", "splits": splits, "pipeline": pipeline,
                        "optional": optional})
        return out

    def _module_entry(self, m: dict, mesh: Layout, pipeline_axis: str) -> ModuleEntry:
        if m["kind"] == "mpmd":
            return ModuleEntry(pattern=m["name"], path=m["path"], kind="mpmd", devices=m["devices"],
                               optional=m["optional"])
        path = m["path"]
        if m["pipeline"] is not None:
            where = f"{path}.strategy.pipeline"
            if pipeline_axis not in mesh.alias_names:
                raise ConfigError(where, f"the mesh {mesh.alias_names} has no pipeline axis {pipeline_axis!r}; add one "
                                         f"of size {m['pipeline']} to device_matrix/alias_names")
            size = mesh.axis_size(pipeline_axis)
            if m["pipeline"] != size:
                raise ConfigError(where, f"{m['pipeline']} stages, but the mesh's {pipeline_axis!r} axis has size {size}; "
                                         "the number of stages must equal that axis size")
        dims: Dict[int, List[str]] = {}
        for alias, counts in m["splits"].items():
            where = f"{path}.strategy.{alias}"
            if alias not in mesh.alias_names:
                raise ConfigError(where, f"unknown key {alias!r}; expected a mesh alias {mesh.alias_names} or 'pipeline'")
            size = mesh.axis_size(alias)
            split_dims = []
            for d, count in enumerate(counts):
                if count not in (1, size):
                    raise ConfigError(where, f"split count {count} at dimension {d} of {_fmt(counts)}: expected 1 or the "
                                             f"size of axis {alias!r} ({size})")
                if count == size and size > 1:
                    split_dims.append(d)
            if len(split_dims) > 1:
                raise ConfigError(where, f"{_fmt(counts)} splits dimensions {split_dims} along axis {alias!r}; one axis "
                                         "can split at most one dimension of a tensor")
            for d in split_dims:
                dims.setdefault(d, []).append(alias)
        rank = max(dims) + 1 if dims else 0
        tmap = []
        for d in range(rank):
            aliases = sorted(dims.get(d, []), key=mesh.axis_index)
            tmap.append(None if not aliases else aliases[0] if len(aliases) == 1 else tuple(aliases))
        return ModuleEntry(pattern=m["name"], path=path, kind="spmd", splits=dict(m["splits"]),
                           pipeline=m["pipeline"], tensor_map=tuple(tmap), optional=m["optional"])

    # -- small fields ------------------------------------------------------------------------
    def _context_parallel(self, mesh: Layout) -> Optional[ContextParallel]:
        """`parallel_config.context_parallel: {axis: cp, method: ring}` (method defaults to ring)."""
        raw = self.pc.get("context_parallel")
        path = "parallel_config.context_parallel"
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ConfigError(path, f"{raw!r}; expected a mapping with keys {CONTEXT_KEYS}")
        unknown = [k for k in raw if k not in CONTEXT_KEYS]
        if unknown:
            raise ConfigError(f"{path}.{unknown[0]}", f"unknown key; expected one of {CONTEXT_KEYS}")
        if "axis" not in raw:
            raise ConfigError(f"{path}.axis", "missing; expected the mesh alias that splits the sequence")
        axis = self._alias(mesh, raw["axis"], f"{path}.axis")
        try:
            return ContextParallel.declare(mesh, axis, raw.get("method"), f"{path}.method")
        except ValueError as exc:
            raise ConfigError(f"{path}.method", str(exc).split(": ", 1)[1]) from None

    @staticmethod
    def _alias(mesh: Layout, alias: Any, path: str) -> str:
        if not isinstance(alias, str) or alias not in mesh.alias_names:
            raise ConfigError(path, f"{alias!r}; expected a mesh alias {mesh.alias_names}")
        return alias

    def _tensor_map(self, value: Any, mesh: Layout, path: str) -> Tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"{value!r}; expected a list with one alias, None or list of aliases per dimension")
        out = []
        for i, entry in enumerate(value):
            if entry is None or entry == NONE_ALIAS:
                out.append(None)
            elif isinstance(entry, str):
                out.append(self._alias(mesh, entry, f"{path}[{i}]"))
            elif isinstance(entry, (list, tuple)):
                out.append(tuple(self._alias(mesh, a, f"{path}[{i}]") for a in entry))
            else:
                raise ConfigError(f"{path}[{i}]", f"{entry!r}; expected an alias {mesh.alias_names}, None or a list")
        used = [a for e in out for a in _aliases_of(e)]
        if len(used) != len(set(used)):
            raise ConfigError(path, f"{value!r} uses a mesh axis more than once")
        return tuple(out)

    def _optimizer(self, mesh: Layout, data_axis: Optional[str]) -> Tuple[Optional[str], bool]:
        raw = self.pc.get("optimizer", {}) or {}
        if not isinstance(raw, dict):
            raise ConfigError("parallel_config.optimizer", f"{raw!r}; expected a mapping with keys {OPTIMIZER_KEYS}")
        unknown = [k for k in raw if k not in OPTIMIZER_KEYS]
        if unknown:
            raise ConfigError(f"parallel_config.optimizer.{unknown[0]}", f"unknown key; expected one of {OPTIMIZER_KEYS}")
        sharding = raw.get("sharding", False)
        axis = None
        if sharding is True:
            if data_axis is None:
                raise ConfigError("parallel_config.optimizer.sharding", "True needs a data axis to shard along; set "
                                                                        "parallel_config.data_axis or name an alias here")
            axis = data_axis
        elif isinstance(sharding, str):
            axis = self._alias(mesh, sharding, "parallel_config.optimizer.sharding")
        elif sharding is not False and sharding is not None:
            raise ConfigError("parallel_config.optimizer.sharding", f"{sharding!r}; expected True, False or a mesh alias")
        offload = raw.get("offload", False)
        if not isinstance(offload, bool):
            raise ConfigError("parallel_config.optimizer.offload", f"{offload!r}; expected True or False")
        return axis, offload

    def _parameters(self, mesh: Layout) -> List[ParameterEntry]:
        out = []
        for path, item, name in self._named_entries("parameter_level", PARAMETER_KEYS, "{name, tensor_map}",
                                                    "a parameter name or pattern"):
            if "tensor_map" not in item:
                raise ConfigError(f"{path}.tensor_map", "missing; expected e.g. [tensor, None]")
            out.append(ParameterEntry(name, self._tensor_map(item["tensor_map"], mesh, f"{path}.tensor_map"), path,
                                      _optional(item, path)))
        return out


def _optional(item: dict, path: str) -> bool:
    """An entry's `optional` flag (default False): True lets its pattern match nothing."""
    value = item.get("optional", False)
    if not isinstance(value, bool):
        raise ConfigError(f"{path}.optional", f"{value!r}; expected true or false")
    return value


def parse_split_tuple(value: Any, path: str) -> Tuple[int, ...]:
    """Parse per-dimension split counts: "(2,1)" (YAML string), [2, 1] or (2, 1).

    Raises:
        ConfigError: not a non-empty sequence of positive ints.
    """
    if isinstance(value, str):
        match = _TUPLE_RE.match(value.strip())
        if not match:
            raise ConfigError(path, f"{value!r}; expected split counts like (2,1)")
        counts = tuple(int(v) for v in match.group(1).split(","))
    elif isinstance(value, (list, tuple)) and value:
        if any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise ConfigError(path, f"{value!r}; expected split counts like (2,1) (positive ints)")
        counts = tuple(value)
    else:
        raise ConfigError(path, f"{value!r}; expected split counts like (2,1)")
    if any(c <= 0 for c in counts):
        raise ConfigError(path, f"{value!r}; split counts must be positive")
    return counts


def _aliases_of(entry) -> Tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _fmt(counts: Sequence[int]) -> str:
    return "(" + ",".join(str(c) for c in counts) + ")"
