"""`shard_module` with a `ShardingPlan`: HyperParallel's declarative form (parameter layouts,
and the layouts DTensor inputs and outputs of the model or its submodules are moved to)."""
from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from mindspore import nn

from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh
from mindspore_hyper.hyper_parallel.distribute import distribute_module, local_values
from mindspore_hyper.hyper_parallel.session import holds_all_ranks, job_size

__all__ = ["ShardingPlan", "shard_module"]


@dataclass
class ShardingPlan:
    """What `shard_module` lays out.

    Attributes:
        plan: parameter name -> placements (one per mesh dimension, or the alias form: one mesh
            dimension name / "None" per tensor dimension). A name is a full one
            ("mlp_layers.0.weight") or, as upstream, one inside a submodule ("weight"): the first
            Parameter found with it, depth-first in definition order.
        input_plan: "input" (the model) or "<submodule>.input" -> placements of each positional
            input, or one placements tuple for the first: DTensor inputs are moved to them.
        output_plan: "output" or "<submodule>.output" -> the same for outputs.
        return_local_tensor: submodules whose DTensor outputs become local tensors.
    """

    plan: Optional[Dict[str, Any]] = None
    input_plan: Optional[Dict[str, Any]] = None
    output_plan: Optional[Dict[str, Any]] = None
    return_local_tensor: Optional[List[str]] = None


def _is_placements(value) -> bool:
    return isinstance(value, tuple) and bool(value) and not any(isinstance(v, (tuple, list)) and v and
                                                                not all(isinstance(x, str) for x in v) for v in value)


def _per_input(value, suffix: str):
    """A plan entry as a list (by position) or, for inputs, a dict (by `construct`'s argument names)."""
    if isinstance(value, dict):
        if suffix != "input":
            raise ValueError(f"sharding plan entry {value!r}: outputs have no names; give a list of placements")
        return dict(value)
    if value is None:
        return []
    if _is_placements(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(f"sharding plan entry {value!r}: expected placements or a list of them (one per input)")


def _move(values, plans, mesh: DeviceMesh):
    """Each DTensor among `values` moved to its placements in `plans` (by position; values
    without one, and plain tensors, are left as they are)."""
    single = not isinstance(values, (tuple, list))
    items = [values] if single else list(values)
    for i, placements in enumerate(plans[:len(items)]):
        if placements is not None and isinstance(items[i], DTensor):
            items[i] = items[i].redistribute(mesh, tuple(placements))
    return items[0] if single else type(values)(items)


def _cell(cells: Dict[str, nn.Cell], name: str, what: str) -> nn.Cell:
    if name not in cells:
        near = difflib.get_close_matches(name, list(cells), n=5, cutoff=0.4)
        raise ValueError(f"sharding plan: {what} names submodule {name!r}, which the model does not have; nearest: "
                         f"{near or sorted(cells)[:5]}")
    return cells[name]


def _search_parameter(cell: nn.Cell, key: str):
    """Upstream's search (`search_parameter_by_name`): a Parameter of `cell` itself, else the one
    `key`'s path names ("sub.cell.weight"), else the first found depth-first in the submodules
    (in definition order), each searched the same way. None when there is none."""
    if key in cell._params:
        return cell._params[key]
    path, _, last = key.rpartition(".")
    if path:
        sub = dict(cell.cells_and_names()).get(path)
        if sub is not None and last in sub._params:
            return sub._params[last]
    for child in cell._cells.values():
        if isinstance(child, nn.Cell):
            found = _search_parameter(child, key)
            if found is not None:
                return found
    return None


def _full_parameter_name(model: nn.Cell, key: str) -> str:
    """The full name (as `parameters_and_names` gives it) of the Parameter a plan key names: a
    full name, or, as upstream, a name relative to a submodule ("weight", "0.weight", with or
    without "self."), resolved to the first match depth-first (upstream lays out that one only).

    Raises:
        ValueError: no Parameter matches (the nearest full names are listed).
    """
    names = {id(p): n for n, p in model.parameters_and_names()}
    key = key.replace("self.", "")
    if key in names.values():
        return key
    found = _search_parameter(model, key)
    if found is None or id(found) not in names:
        near = difflib.get_close_matches(key, list(names.values()), n=5, cutoff=0.4)
        raise ValueError(f"ShardingPlan.plan: no parameter {key!r} (a full name, or a name inside a submodule); "
                         f"nearest: {near or sorted(names.values())[:5]}")
    return names[id(found)]


def shard_module(model: nn.Cell, device_mesh: DeviceMesh, sharding_plan: ShardingPlan) -> Optional[nn.Cell]:
    """Lay `model`'s planned Parameters out on `device_mesh` (the others replicated) and move its
    and its submodules' DTensor inputs/outputs as the plan says. As upstream, a job of one
    device leaves the model alone and returns None.

    Raises:
        ValueError: a plan naming a parameter or submodule the model does not have (the nearest
            names are listed), keys not ending in "input"/"output", placements that do not fit.
    """
    if not isinstance(sharding_plan, ShardingPlan):
        raise TypeError(f"shard_module: sharding_plan must be a ShardingPlan, got {type(sharding_plan).__name__}")
    if job_size() == 1 and holds_all_ranks():
        return None
    parameter_plan = {_full_parameter_name(model, key): value for key, value in (sharding_plan.plan or {}).items()}
    cells = dict(model.cells_and_names())
    hooks: Dict[str, Dict[str, Any]] = {}
    for section, suffix in ((sharding_plan.input_plan, "input"), (sharding_plan.output_plan, "output")):
        for key, value in (section or {}).items():
            prefix, _, last = key.rpartition(".")
            if last != suffix:
                raise ValueError(f"ShardingPlan.{suffix}_plan key {key!r}: must be {suffix!r} or '<submodule>.{suffix}'")
            _cell(cells, prefix, f"{suffix}_plan key {key!r}")
            hooks.setdefault(prefix, {})[suffix] = _per_input(value, suffix)
    for name in sharding_plan.return_local_tensor or ():
        _cell(cells, name, "return_local_tensor")
        hooks.setdefault(name, {})["local"] = True
    distribute_module(model, device_mesh, parameter_shard_plan=parameter_plan)
    for name, hook in hooks.items():
        _wrap(cells[name], device_mesh, hook)
    return model


def _wrap(cell: nn.Cell, mesh: DeviceMesh, hook) -> None:
    """Move the Cell's DTensor inputs (positional, then keyword ones by their place in
    `construct`'s signature) and outputs as `hook` says; make outputs local if asked."""
    inner = cell.construct
    names = list(inspect.signature(inner).parameters)
    inputs, outputs, local = hook.get("input") or [], hook.get("output") or [], hook.get("local", False)

    by_name = inputs if isinstance(inputs, dict) else {n: p for n, p in zip(names, inputs)}
    unknown = set(by_name) - set(names)
    if unknown and not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in inspect.signature(inner).parameters.values()):
        raise ValueError(f"ShardingPlan input_plan names {sorted(unknown)}, which {type(cell).__name__}.construct does "
                         f"not take (it takes {names})")

    def construct(*args, **kwargs):
        if by_name:
            args = _move(tuple(args), [by_name.get(n) for n in names[:len(args)]], mesh)
            for key in list(kwargs):
                if by_name.get(key) is not None:
                    kwargs[key] = _move(kwargs[key], [by_name[key]], mesh)
        result = inner(*args, **kwargs)
        if outputs:
            result = _move(result, outputs, mesh)
        return local_values(result) if local else result

    object.__setattr__(cell, "construct", construct)
