"""The Cell tree of a converted model, and the Cell itself.

The tree mirrors the torch module tree: a torch module with a mapping becomes that MindSpore
layer (nn.Dense, nn.LayerNorm, ...), ModuleList/Sequential become nn.CellList, every other module
becomes a `Module` container holding its own parameters and buffers under their torch names.
Constants computed at conversion time live in a `constants` container. Tied torch parameters stay
one MindSpore Parameter. The Cell is an instance of the generated class (codegen.py), so the Cell
in memory and the source written to disk are the same code.
"""
from __future__ import annotations

import keyword
import linecache
import re
import types
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from mindspore import nn

from mindspore_hyper.migrate.errors import MigrationError
from mindspore_hyper.migrate.graph import Graph
from mindspore_hyper.migrate.lowering import type_name
from mindspore_hyper.migrate.mappings import ModuleMapping, lookup_module
from mindspore_hyper.migrate.mappings.registry import Unsupported

__all__ = ["ParamSpec", "CellNode", "CellPlan", "plan_cells", "instantiate", "load_source", "load_generated", "is_identifier", "member_access"]


@dataclass(frozen=True)
class ParamSpec:
    """A Parameter the generated __init__ creates (zeros until the checkpoint is loaded)."""

    shape: Tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool


@dataclass
class CellNode:
    """One Cell of the tree.

    Attributes:
        path: torch module path ("" for the root).
        torch_type: the torch class, as reports print it.
        kind: "leaf" (a mapped MindSpore layer), "list" (nn.CellList) or "module" (a container).
        init: the constructor code of a leaf.
        mapping: the ModuleMapping of a leaf.
        children: name -> CellNode, in torch's order.
        params: name -> ParamSpec of the raw parameters/buffers this container holds.
    """

    path: str
    torch_type: str
    kind: str
    init: str = ""
    mapping: Optional[ModuleMapping] = None
    children: Dict[str, "CellNode"] = field(default_factory=dict)
    params: Dict[str, ParamSpec] = field(default_factory=dict)

    def empty(self) -> bool:
        return self.kind != "leaf" and not self.params and all(c.empty() for c in self.children.values())


@dataclass
class CellPlan:
    """What the generated class holds, and how the forward code reaches it.

    Attributes:
        root: the tree.
        constants: Cell name -> torch value of the constants computed at conversion time.
        constant_of: graph node name -> its Cell constant name.
        ties: (alias expression, owner expression) per tied parameter.
        attr_access: torch parameter/buffer name -> expression in generated code (None: unreadable).
        module_access: torch module path -> expression of its Cell.
        problems: modules or parameters that cannot be mapped.
    """

    root: CellNode
    constants: Dict[str, torch.Tensor] = field(default_factory=dict)
    constant_of: Dict[str, str] = field(default_factory=dict)
    ties: List[Tuple[str, str]] = field(default_factory=list)
    attr_access: Dict[str, Optional[str]] = field(default_factory=dict)
    module_access: Dict[str, str] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)


def is_identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def member_access(owner: str, name: str) -> str:
    """`owner.name`, or `getattr(owner, "0")` for names that are not identifiers (Sequential at the root)."""
    return f"{owner}.{name}" if is_identifier(name) else f"getattr({owner}, {name!r})"


def _build_node(module: torch.nn.Module, path: str, access: str, plan: CellPlan, first_owner: Dict[int, str]) -> CellNode:
    mapping = lookup_module(module) if path else None  # the root is the generated class itself
    plan.module_access[path] = access
    if mapping is not None:
        node = CellNode(path, type_name(type(module)), "leaf", mapping=mapping)
        try:
            node.init = mapping.build(module)
        except Unsupported as exc:
            plan.problems.append(f"{node.torch_type} at {path!r}: {exc}")
        for name, p in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            full = f"{path}.{name}" if path else name
            ms_name = mapping.params.get(name)
            relaid = name in mapping.relaid
            plan.attr_access[full] = None if ms_name is None or relaid else f"{access}.{ms_name}"
            first_owner.setdefault(id(p), full)
        return node
    is_list = bool(path) and isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential))
    node = CellNode(path, type_name(type(module)), "list" if is_list else "module")
    if isinstance(module, torch.nn.ParameterList) or isinstance(module, torch.nn.ParameterDict):
        plan.problems.append(f"{node.torch_type} at {path!r}: parameter containers are not mapped; hold the "
                             "parameters as module attributes")
    skip = set(getattr(module, "_non_persistent_buffers_set", ()))  # torch's own record of them
    for name, p in list(module.named_parameters(recurse=False)) + [
            (n, b) for n, b in module.named_buffers(recurse=False) if n not in skip]:
        full = f"{path}.{name}" if path else name
        plan.attr_access[full] = member_access(access, name)
        if id(p) in first_owner:
            continue  # tied: the alias is assigned after construction
        first_owner[id(p)] = full
        trainable = isinstance(p, torch.nn.Parameter) and p.requires_grad
        node.params[name] = ParamSpec(tuple(p.shape), p.dtype, trainable)
    for name, child in module.named_children():
        child_access = f"{access}[{name}]" if is_list else member_access(access, name)
        node.children[name] = _build_node(child, f"{path}.{name}" if path else name, child_access, plan, first_owner)
    return node


def _constant_name(node_name: str, target, taken: set) -> str:
    base = re.sub(r"\W", "_", target if isinstance(target, str) else node_name).strip("_") or "constant"
    if not base[0].isalpha():
        base = f"c_{base}"
    name, i = base, 1
    while name in taken or not is_identifier(name):
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def plan_cells(module: torch.nn.Module, graph: Graph) -> CellPlan:
    """The Cell tree of `module` and how `graph`'s forward code reaches its parts."""
    plan = CellPlan(root=CellNode("", "", "module"))
    first_owner: Dict[int, str] = {}
    plan.root = _build_node(module, "", "self", plan, first_owner)  # needs plan for its maps and problems
    for name, p in module.named_parameters(remove_duplicate=False):
        owner = first_owner.get(id(p))
        if owner is not None and owner != name:
            alias, source = plan.attr_access.get(name), plan.attr_access.get(owner)
            if alias is None or source is None:
                plan.problems.append(f"tied parameters {owner!r} and {name!r}: one of them changes layout in "
                                     "MindSpore, so they cannot share one Parameter")
            else:
                plan.ties.append((alias, source))
    taken = set(plan.root.children) | set(plan.root.params)
    for node in graph.nodes:
        if node.op == "constant" and isinstance(node.example, torch.Tensor):
            name = _constant_name(node.name, node.target, taken)
            plan.constants[name] = node.example.detach().clone()
            plan.constant_of[node.name] = name
    return plan


def instantiate(source: str, class_name: str, module_name: str) -> Tuple[nn.Cell, types.ModuleType]:
    """Execute generated `source` as module `module_name` and return (an instance of `class_name`, module)."""
    generated = load_source(source, module_name)
    return generated.__dict__[class_name](), generated


def load_source(source: str, module_name: str) -> types.ModuleType:
    """Execute generated `source` as module `module_name` (registered with linecache, so tracebacks and
    inspect show the generated lines) and return the module."""
    filename = f"<mindspore_hyper.migrate:{module_name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    generated = types.ModuleType(module_name)
    generated.__file__ = filename
    exec(compile(source, filename, "exec"), generated.__dict__)  # noqa: S102 - our own generated code
    return generated


def load_generated(source: str, class_name: str, stem: str) -> nn.Cell:
    """Compile and import generated `source` and build its `class_name` (before anything is written).

    Raises:
        MigrationError: the source does not compile or its class cannot be built (a converter bug: the
            message names the line), instead of a bare SyntaxError from the package's loader.
    """
    try:
        cell, _ = instantiate(source, class_name, stem)
    except SyntaxError as exc:
        raise MigrationError(f"the generated source of {class_name} does not compile (nothing was written): "
                             f"SyntaxError: {exc.msg} at line {exc.lineno}: {(exc.text or '').strip()}") from exc
    except Exception as exc:
        raise MigrationError(f"the generated {class_name} cannot be built (nothing was written): "
                             f"{type(exc).__name__}: {exc}") from exc
    return cell
