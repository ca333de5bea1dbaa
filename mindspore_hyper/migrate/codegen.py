"""Readable MindSpore source for a traced torch model: a Cell class a user can keep and edit.

`__init__` builds the Cell tree (cell_builder.CellPlan) as nested constructor calls mirroring the
torch modules; `construct` is the traced program, one line per op, with the torch source line it
came from as a comment. The helpers the code uses (generated_support.py) are copied into the file, so it
needs only MindSpore and NumPy.
"""
from __future__ import annotations

import builtins
import inspect
import keyword
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from mindspore_hyper.migrate import generated_support as helpers
from mindspore_hyper.migrate.cell_builder import CellNode, CellPlan, ParamSpec, is_identifier, member_access
from mindspore_hyper.migrate.graph import Graph, Node, node_refs
from mindspore_hyper.migrate.mappings import lookup_function
from mindspore_hyper.migrate.mappings.common import literal, ms_dtype, render_literal
from mindspore_hyper.migrate.mappings.registry import NO_VALUE, NOT_CONSTANT, Alias, Arg, Unsupported
from mindspore_hyper.migrate.naming import FILE_NAMES, identifier

__all__ = ["MappingUse", "GeneratedCode", "generate", "root_class_name"]

_RESERVED = set(FILE_NAMES) | {"self"} | set(helpers.HELPERS)
_INDENT = "    "


@dataclass(frozen=True)
class MappingUse:
    """One converted op: the torch op, the MindSpore API it became, where it was."""

    torch_op: str
    mindspore: str
    node: str
    where: str


@dataclass
class GeneratedCode:
    """The generated module source and what went into it."""

    source: str
    class_name: str
    uses: List[MappingUse] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


def root_class_name(name: str) -> str:
    """The generated root class's name: `name` made a valid identifier that shadows nothing of the file
    (`Cell` appended where it would: `MoE` -> `MoECell`)."""
    base = re.sub(r"\W", "_", name)
    clash = base in _RESERVED or base in ("Module", "Cell") or keyword.iskeyword(base) or not base.isidentifier() \
        or base in dir(builtins)
    return identifier(base + "Cell" if clash else base, set(), _RESERVED | {"Module", "Cell"}, suffix="")


def _variable(name: str, taken: set) -> str:
    """A local name: valid, unique in its construct, shadowing no module-level name or builtin (a variable
    named `slice` would break a later `x[slice(a, b)]`)."""
    return identifier(name, taken, _RESERVED)


class _Forward:
    """Renders the construct() body."""

    def __init__(self, graph: Graph, plan: CellPlan):
        self.graph, self.plan = graph, plan
        self.expr: Dict[Node, str] = {}
        self.constant_value: Dict[Node, Any] = {}
        self.lines: List[str] = []
        self.uses: List[MappingUse] = []
        self.problems: List[str] = []
        self.failed: set = set()  # nodes that could not be converted, and everything computed from them
        self.taken: set = set()

    # -- arguments ------------------------------------------------------------------------------
    def arg(self, value: Any) -> Arg:
        if isinstance(value, Node):
            if value in self.constant_value:
                return literal(self.constant_value[value])
            if value not in self.expr:
                raise Unsupported(f"`{value.name}` ({value.display}) has no value in MindSpore (it was dropped)")
            return Arg(self.expr[value], NOT_CONSTANT, value.example)
        if isinstance(value, (list, tuple)):
            items = [self.arg(v) for v in value]
            inner = ", ".join(a.code for a in items)
            code = f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(items) == 1 else ''})"
            const = type(value)(a.value for a in items) if all(a.is_constant for a in items) else NOT_CONSTANT
            return Arg(code, const, None, items, "list" if isinstance(value, list) else "tuple")
        if isinstance(value, slice):
            items = [self.arg(value.start), self.arg(value.stop), self.arg(value.step)]
            if all(a.is_constant for a in items):
                return literal(slice(*(a.value for a in items)))
            return Arg(f"slice({', '.join(a.code for a in items)})", NOT_CONSTANT, None, items, "slice")
        return literal(value)

    def emit_call(self, node: Node, emit) -> Any:
        args = [self.arg(a) for a in node.args]
        kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
        signature = inspect.signature(emit)
        params = signature.parameters
        if "input" in kwargs and "input" not in params and "self" in params:
            kwargs["self"] = kwargs.pop("input")
        if "result" in params:
            kwargs["result"] = Arg("", NOT_CONSTANT, node.example)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise Unsupported(f"its arguments do not match the mapping ({exc})") from None
        for name, p in params.items():
            if name not in bound.arguments and p.default is not inspect.Parameter.empty:
                bound.arguments[name] = literal(p.default)
        return emit(*bound.args, **bound.kwargs)

    # -- nodes ------------------------------------------------------------------------------------
    def render(self) -> None:
        used = set(node_refs([(n.args, n.kwargs) for n in self.graph.nodes])) | set(self.graph.output_nodes())
        scope, location = None, None
        for node in self.graph.nodes:
            if node.op == "input":
                self.expr[node] = _variable(str(node.target), self.taken)
                continue
            line = self.render_used(node, used)
            if line is None:
                continue
            if node.scope != scope:
                scope = node.scope
                if self.lines:
                    self.lines.append("")
                self.lines.append(f"# {scope} ({node.scope_type})" if scope else "# (root module)")
            if node.location is not None and node.location != location:
                location = node.location
                self.lines.append(f"# {location.short}: {location.code}")
            self.lines.append(line)

    def render_used(self, node: Node, used: set) -> Optional[str]:
        """The line of `node` if it is written: None when an input already failed, when it fails
        (the problem is recorded) or when nothing uses it (an unused value is still converted, so
        unmapped ops surface, but not written)."""
        if any(ref in self.failed for ref in node_refs((node.args, node.kwargs))):
            self.failed.add(node)  # its input already has a problem reported
            return None
        try:
            line = self.render_node(node)
        except Unsupported as exc:
            self.problems.append(f"{node.display}: {exc} ({node.where()})")
            self.failed.add(node)
            return None
        return line if node in used else None

    def render_node(self, node: Node) -> Optional[str]:
        if node.op == "attr":
            access = self.plan.attr_access.get(node.target)
            if access is None:
                raise Unsupported(f"the parameter {node.target!r} is not readable as a torch tensor in MindSpore "
                                  "(its layer keeps it under another layout)")
            self.expr[node] = access
            return None
        if node.op == "constant":
            if node.name in self.plan.constant_of:
                self.expr[node] = f"self.constants.{self.plan.constant_of[node.name]}"
            else:
                render_literal(node.example)  # raises Unsupported for values code cannot hold
                self.constant_value[node] = node.example
            return None
        var = _variable(node.name, self.taken)
        if node.op == "module":
            access = self.plan.module_access[node.target]
            module_mapping = self._leaf_mapping(node.target)
            args = ", ".join(self.arg(a).code for a in node.args)
            self.uses.append(MappingUse(node.display, module_mapping, node.name, node.where()))
            self.expr[node] = var
            return f"{var} = {access}({args})"
        mapping = lookup_function(node.target)
        if mapping is None:
            raise Unsupported("no MindSpore mapping for this torch op")
        emitted = self.emit_call(node, mapping.emit)
        self.uses.append(MappingUse(mapping.torch_name, mapping.ms_name, node.name, node.where()))
        if isinstance(emitted, Alias):
            self.expr[node] = emitted.arg.code
            return None
        if emitted is NO_VALUE:
            return None
        self.expr[node] = var
        return f"{var} = {emitted}"

    def _leaf_mapping(self, path: str) -> str:
        node = self.plan.root
        for part in path.split("."):
            node = node.children[part]
        if node.kind != "leaf":
            raise Unsupported(f"module {path!r} is called but has no MindSpore layer")
        return node.mapping.ms_name

    def outputs(self) -> str:
        parts = []
        for value in self.graph.outputs:
            if isinstance(value, Node) and value in self.failed:
                continue
            try:
                parts.append(self.arg(value).code)
            except Unsupported as exc:
                self.problems.append(f"output: {exc}")
        if len(parts) == 1:
            return parts[0]
        return ", ".join(parts) if parts else "None"


# -- __init__ ------------------------------------------------------------------------------------
def _param_code(spec) -> str:
    shape = render_literal(tuple(spec.shape))
    dtype = "" if spec.dtype == torch.float32 else f", {ms_dtype(spec.dtype)}"
    grad = "" if spec.requires_grad else ", requires_grad=False"
    return f"param({shape}{dtype}{grad})"


def _cell_code(node: CellNode, depth: int) -> str:
    pad = _INDENT * (depth + 1)
    if node.kind == "leaf":
        return node.init
    if node.kind == "list":
        items = [f"{pad}{_cell_code(c, depth + 1)}," for c in node.children.values()]
        return "nn.CellList([  # " + node.torch_type + "\n" + "\n".join(items) + "\n" + _INDENT * depth + "])"
    members = [(n, _param_code(p)) for n, p in node.params.items()]
    members += [(n, _cell_code(c, depth + 1)) for n, c in node.children.items() if not c.empty()]
    if all(is_identifier(n) for n, _ in members):
        body = "\n".join(f"{pad}{n}={code}," for n, code in members)
        return f"Module(  # {node.torch_type}\n{body}\n{_INDENT * depth})"
    body = "\n".join(f"{pad}{n!r}: {code}," for n, code in members)
    return f"Module(**{{  # {node.torch_type}\n{body}\n{_INDENT * depth}}})"


def _init_lines(plan: CellPlan) -> List[str]:
    lines = []
    root = plan.root
    for name, spec in root.params.items():
        lines.append(_assign("self", name, _param_code(spec)))
    for name, child in root.children.items():
        if not child.empty():
            lines.append(_assign("self", name, _cell_code(child, 0)))
    if plan.constants:
        lines.append("# values computed by torch at conversion time (masks, position ids, ...)")
        members = "\n".join(
            f"{_INDENT}{n}={_param_code(_constant_spec(v))}," for n, v in plan.constants.items())
        lines.append(f"self.constants = Module(\n{members}\n)")
    if plan.ties:
        lines.append("# tied weights: one Parameter, as in torch")
        lines += [f"{alias} = {owner}" for alias, owner in plan.ties]
    return lines


def _constant_spec(value: torch.Tensor) -> ParamSpec:
    return ParamSpec(tuple(value.shape), value.dtype, False)


def _assign(owner: str, name: str, code: str) -> str:
    target = member_access(owner, name)
    return f"{target} = {code}" if is_identifier(name) else f"setattr({owner}, {name!r}, {code})"


def _indent(lines: List[str], depth: int) -> str:
    out = []
    for line in lines:
        out.extend((_INDENT * depth + part) if part else "" for part in line.split("\n"))
    return "\n".join(out)


def _helpers_source(text: str) -> str:
    used = [name for name, obj in helpers.HELPERS.items() if re.search(rf"\b{name}\(", text)]
    return "\n\n\n".join(inspect.getsource(helpers.HELPERS[name]).rstrip() for name in used)


def generate(graph: Graph, plan: CellPlan, class_name: str, torch_type: str, checkpoint_name: str) -> GeneratedCode:
    """The module source of the converted Cell class (see module docstring)."""
    forward = _Forward(graph, plan)
    forward.render()
    returned = forward.outputs()
    inputs = [forward.expr[n] for n in graph.inputs]
    body: List[str] = []
    if graph.shape_specialized:
        body.append("# torch.export specialised the program to these input shapes")
        for node in graph.inputs:
            shape = tuple(node.example.shape) if isinstance(node.example, torch.Tensor) else None
            if shape is not None:
                var = forward.expr[node]
                body.append(f"if tuple({var}.shape) != {shape!r}:")
                body.append(f"{_INDENT}raise ValueError(f\"{class_name} was converted for {var} of shape "
                            f"{shape}, got {{tuple({var}.shape)}}\")")
    if body:
        body.append("")
    body += forward.lines
    body.append("")
    body.append(f"return {returned}")
    init = _init_lines(plan)
    outputs_doc = ", ".join(graph.output_names)
    klass = (
        f"class {class_name}(nn.Cell):\n"
        f'    """{torch_type} converted from PyTorch ({graph.tracer}); returns {outputs_doc}."""\n\n'
        f"    def __init__(self):\n"
        f"        super().__init__()\n"
        f"{_indent(init, 2)}\n\n"
        f"    def construct(self, {', '.join(inputs)}):\n"
        f"{_indent(body, 2)}\n"
    )
    helper_text = _helpers_source(klass)
    source = module_source(f"{class_name}: {torch_type} converted to MindSpore by mindspore_hyper.migrate.",
                           class_name, checkpoint_name, helper_text, klass)
    return GeneratedCode(source, class_name, forward.uses, forward.problems)


def module_source(summary: str, class_name: str, checkpoint_name: str, helper_text: str, classes: str,
                  extra_imports: str = "") -> str:
    """The text of a generated module: its docstring (`summary`, then how to edit and load it),
    imports, the helpers it uses, its classes and `build()`, which makes the root `class_name`."""
    return (
        f'"""{summary}\n\n'
        f"Edit freely. Weights: `build(\"{checkpoint_name}\")` loads the MindSpore checkpoint written beside "
        f"this file.\n\"\"\"\n"
        "import math\n\n"
        "import numpy as np\n"
        "import mindspore as ms\n"
        "from mindspore import Parameter, Tensor, mint, nn, ops\n"
        + extra_imports + "\n\n"
        + (helper_text + "\n\n\n" if helper_text else "")
        + classes.rstrip("\n") + "\n\n\n"
        f"def build(checkpoint=None, training=False):\n"
        f'    """A {class_name}; with `checkpoint` (a .ckpt path) its weights are loaded (every parameter must be '
        'there)."""\n'
        f"    cell = {class_name}()\n"
        f"    if checkpoint is not None:\n"
        f"        missing, _ = ms.load_param_into_net(cell, ms.load_checkpoint(checkpoint), strict_load=True)\n"
        f"        if missing:\n"
        f"            raise ValueError(f\"{{checkpoint}} lacks parameters {{missing}}\")\n"
        f"    cell.set_train(training)\n"
        f"    return cell\n"
    )
