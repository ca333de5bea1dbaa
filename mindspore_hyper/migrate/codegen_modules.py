"""MindSpore source with one Cell class per torch module class, from a module-structured trace.

Each torch module becomes: its mapped MindSpore layer (nn.Dense, nn.Embedding, ...), an nn.CellList
(ModuleList), an nn.CellDict (ModuleDict: the parametrizations of a weight-normed layer), or an
instance of a generated class named after its torch class whose `__init__`
creates its parameters (torch names) and children, and whose `construct` holds its own ops.
Modules whose generated code is the same share the class, so the source grows with the number of
distinct module classes, not with depth; a parent's consecutive calls of every layer of a CellList,
each feeding the next, are written back as a loop. Float hyper-parameters the module keeps as
attributes (epsilon, attention scaling) become `__init__` arguments when its code uses them.
"""
from __future__ import annotations

import builtins
import inspect
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from mindspore import nn

from mindspore_hyper.migrate import generated_support as helpers
from mindspore_hyper.migrate.cell_builder import CellNode, CellPlan, ParamSpec, is_identifier, member_access
from mindspore_hyper.migrate.codegen import (_INDENT, _RESERVED, MappingUse, _Forward, _param_code, _variable,
                                             module_source)
from mindspore_hyper.migrate.graph import Node, node_refs
from mindspore_hyper.migrate.lowering import type_name
from mindspore_hyper.migrate.mappings import lookup_module
from mindspore_hyper.migrate.mappings.common import render_literal
from mindspore_hyper.migrate.mappings.registry import Arg, Unsupported
from mindspore_hyper.migrate.moe_blocks import moe_class_source
from mindspore_hyper.migrate.naming import identifier
from mindspore_hyper.migrate.sized import CACHE_ATTR, METHOD, MIN_CACHED_OPS, size_inputs, size_only_nodes
from mindspore_hyper.migrate.trace_modules import ModuleProgram, ModuleTrace

__all__ = ["GeneratedClass", "ModuleCode", "generate_modules"]


@dataclass
class GeneratedClass:
    """One generated Cell class and the torch modules it stands for."""

    name: str
    torch_type: str
    paths: List[str]
    hyperparameters: List[str]
    lines: int


@dataclass
class ModuleCode:
    """The generated module source and what went into it."""

    source: str
    class_name: str
    classes: List[GeneratedClass] = field(default_factory=list)
    layers: Dict[str, str] = field(default_factory=dict)  # module path -> MindSpore layer it maps to
    loops: List[str] = field(default_factory=list)  # CellList paths whose calls became a loop
    uses: List[MappingUse] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    ties: List[Tuple[str, str]] = field(default_factory=list)  # (alias torch name, owner torch name)
    buffers: Dict[str, torch.Tensor] = field(default_factory=dict)  # Cell name -> value not in the state_dict
    moe_blocks: List[str] = field(default_factory=list)  # paths of blocks that became mindspore_hyper.moe.MoE
    fallbacks: List[Dict[str, str]] = field(default_factory=list)  # modules written as their traced body, and why


def _canonical(name: str) -> str:
    return re.sub(r"_\d+$", "", name) or name


def _child_expr(owner: str, path: str, lists: set, prefix: str) -> str:
    """Attribute chain from `owner` to the child at relative `path` (`self.layers[0].mlp`)."""
    expr, walked = owner, prefix
    for part in path.split("."):
        full = f"{walked}.{part}" if walked else part
        expr = f"{expr}[{part}]" if walked in lists and part.isdigit() else member_access(expr, part)
        walked = full
    return expr


@dataclass
class _Unit:
    """What a parent needs of one of its children."""

    ctor: str
    leaf_params: Optional[Dict[str, str]] = None  # torch name -> layer attribute (mapped leaves)
    relaid: tuple = ()
    passthrough: Dict[int, int] = field(default_factory=dict)  # output index -> the input it returns as is
    kept: List[int] = field(default_factory=list)  # torch output indices the generated construct returns
    tuple_out: bool = False
    identity: bool = False  # a layer that returns its input (dropout with p=0): callers skip the call
    inputs: Optional[List[int]] = None  # the call's arguments passed (a MoE Cell: the hidden states); None: all


class _ClassForward(_Forward):
    """construct() of one module: attributes are its own, module calls are its children (loops folded)."""

    def __init__(self, program: ModuleProgram, units: Dict[str, _Unit], lists: set, hyper: Dict[str, float],
                 plain: bool = False):
        super().__init__(program.graph, CellPlan(root=CellNode("", "", "module")))
        self.plain = plain  # the traced body as is: no loops folded, no size-only cache
        self.program, self.units, self.lists, self.hyper = program, units, lists, hyper
        self.used_hyper: List[str] = []
        self.in_sizes = 0
        self.loops: List[str] = []
        self.prefix = program.path
        self.sized_lines: List[str] = []  # the size-only lines (sized.py), computed once per size
        self.sized_call: List[str] = []  # the placeholder of their cached call in construct
        self.sized_keys: List[str] = []
        self.sized_exports: List[str] = []

    def full(self, rel: str) -> str:
        return f"{self.prefix}.{rel}" if self.prefix else rel

    def arg(self, value: Any) -> Arg:
        if isinstance(value, (list, tuple)):  # sizes: whole numbers may be hyper-parameters there
            self.in_sizes += 1
            try:
                return super().arg(value)
            finally:
                self.in_sizes -= 1
        name = _hyper_name(value, self.hyper, sizes=self.in_sizes > 0)
        if name is not None:
            if name not in self.used_hyper:
                self.used_hyper.append(name)
            return Arg(f"self.{name}", value, value)
        return super().arg(value)

    def call_args(self, node: Node) -> List[Any]:
        return list(node.args)  # trace_modules already left out the sizes the child re-derives

    def render_node(self, node: Node) -> Optional[str]:
        if node.op == "attr":
            rel = str(node.target)
            owner, _, name = rel.rpartition(".")
            unit = self.units.get(self.full(owner)) if owner else None
            torch_shape = None
            if unit is not None and unit.leaf_params is not None:
                torch_shape = tuple(getattr(node.example, "shape", ()))
                if name not in unit.leaf_params or name in unit.relaid and not torch_shape:
                    raise Unsupported(f"the parameter {rel!r} is not readable as a torch tensor in MindSpore "
                                      "(its layer keeps it under another layout)")
                relaid, name = name in unit.relaid, unit.leaf_params[name]
            base = _child_expr("self", owner, self.lists, self.prefix) if owner else "self"
            self.expr[node] = member_access(base, name)
            if torch_shape and relaid:  # Conv1d's (out, in, 1, k) read as torch's (out, in, k): the same elements
                self.expr[node] = f"mint.reshape({self.expr[node]}, {torch_shape})"
            return None
        if node.op == "module":
            unit = self.units[self.full(node.target)]
            args = self.call_args(node)
            if unit.inputs is not None:  # sizes the exported block took from its caller: the Cell derives them
                args = [args[i] for i in unit.inputs]
            if unit.leaf_params is not None and len(args) != 1:
                raise Unsupported(f"the layer {node.target!r} is called with {len(args)} inputs; a mapped layer "
                                  "takes one")
            if unit.identity:  # p=0 dropout: the identity in training and eval, so no call is written
                self.expr[node] = self.arg(args[0]).code
                return None
            var = _variable(node.name, self.taken)
            self.expr[node] = var
            self.uses.append(MappingUse(type_name(type(self._torch(node.target))), unit.ctor.split("(")[0],
                                        node.name, self.full(node.target)))
            code = ", ".join(self.arg(a).code for a in args)
            return f"{var} = {_child_expr('self', node.target, self.lists, self.prefix)}({code})"
        if node.op == "function" and node.target is operator.getitem and isinstance(node.args[0], Node) \
                and node.args[0].op == "module" and isinstance(node.args[1], int):
            call, i = node.args
            unit = self.units[self.full(call.target)]
            if i in unit.passthrough:  # the child returns this input unchanged: read it here
                self.expr[node] = self.arg(self.call_args(call)[unit.passthrough[i]]).code
                return None
            if unit.leaf_params is None and not unit.tuple_out:
                self.expr[node] = self.expr[call]
                return None
            if unit.leaf_params is None:
                if i not in unit.kept:
                    raise Unsupported(f"output {i} of {call.target!r} could not be converted "
                                      f"(kept {unit.kept}, passed through {unit.passthrough})")
                saved = node.args  # rendered against the kept outputs; the graph itself is left as traced
                node.args = (call, unit.kept.index(i))
                try:
                    return super().render_node(node)
                finally:
                    node.args = saved
        return super().render_node(node)

    def _torch(self, rel: str) -> torch.nn.Module:
        return self.program.module.get_submodule(rel)

    # -- loops over a CellList ---------------------------------------------------------------------
    def _loops(self) -> Dict[Node, Tuple[List[Node], int, bool, Node]]:
        """First call of each foldable run -> (the calls, chained argument position, via [0], final value)."""
        nodes = self.graph.nodes
        users = self.graph.users()
        outputs = set(self.graph.output_nodes())
        found = {}
        i = 0
        while i < len(nodes):
            node = nodes[i]
            run = self._run_at(nodes, i, users, outputs)
            if run is None:
                i += 1
                continue
            calls, k, via_item, last, end = run
            found[node] = (calls, k, via_item, last)
            i = end
        return found

    def _run_at(self, nodes: List[Node], i: int, users, outputs):
        node = nodes[i]
        if node.op != "module" or "." not in node.target:
            return None
        owner, _, index = node.target.rpartition(".")
        if owner not in {p[len(self.prefix) + 1:] if self.prefix else p for p in self.lists} or index != "0":
            return None
        size = len(self._torch(owner))
        calls, getters, j = [node], [], i + 1
        while len(calls) < size and j < len(nodes):
            n = nodes[j]
            prev = calls[-1]
            if n.op == "function" and n.target is operator.getitem and n.args[0] is prev and \
                    n.args[1] == 0 and len(getters) == len(calls) - 1:
                getters.append(n)
                j += 1
                continue
            if n.op != "module" or n.target != f"{owner}.{len(calls)}":
                return None
            calls.append(n)
            j += 1
        if len(calls) != size or size < 2:
            return None
        via_item = bool(getters)
        if via_item and len(getters) != size - 1:
            return None
        if via_item:  # the last call's [0] must follow it directly
            if j >= len(nodes) or nodes[j].op != "function" or nodes[j].args[0] is not calls[-1] or nodes[j].args[1] != 0:
                return None
            getters.append(nodes[j])
            j += 1
        ctor = {self.units[self.full(c.target)].ctor for c in calls}
        if len(ctor) != 1:
            return None
        chained = None
        for n in range(1, size):
            a, b = self.call_args(calls[n - 1]), self.call_args(calls[n])
            link = getters[n - 1] if via_item else calls[n - 1]
            diff = [p for p, (x, y) in enumerate(zip(a, b)) if x is not y]
            if len(a) != len(b) or len(diff) != 1 or b[diff[0]] is not link or (chained not in (None, diff[0])):
                return None
            chained = diff[0]
            if [u for u in users.get(link, []) if u is not calls[n]] or link in outputs:
                return None
            if via_item and ([u for u in users.get(calls[n - 1], []) if u is not link] or calls[n - 1] in outputs):
                return None
        last = getters[-1] if via_item else calls[-1]
        if via_item and ([u for u in users.get(calls[-1], []) if u is not last] or calls[-1] in outputs):
            return None
        return calls, chained, via_item, last, j

    def render(self) -> None:
        used = set(node_refs([(n.args, n.kwargs) for n in self.graph.nodes])) | set(self.graph.output_nodes())
        loops = {} if self.plain else self._loops()
        sized = set() if self.plain else size_only_nodes(self.graph)
        skip: set = set()
        location = None
        for node in self.graph.nodes:
            if node in skip:
                continue
            if node.op == "input":
                self.expr[node] = _variable(_canonical(str(node.target)), self.taken)
                continue
            if node in loops:
                calls, k, via_item, last = loops[node]
                try:
                    self.lines += self._render_loop(calls, k, via_item, last)
                except Unsupported as exc:
                    self.problems.append(f"{node.display}: {exc}")
                    self.failed.add(last)
                skip.update(calls)
                skip.update(n for n in self.graph.nodes if n.op == "function" and n.args and n.args[0] in calls)
                continue
            if node in sized and not self.sized_call:
                self.sized_call = ["<sized call>"]  # its place: where the first size-only value was
                self.lines.append(self.sized_call[0])
            line = self.render_used(node, used)
            if line is None:
                continue
            target = self.sized_lines if node in sized else self.lines
            if node.location is not None and node.location != location:
                location = node.location
                target.append(f"# {location.short}: {location.code}")
            target.append(line)
        self._finish_sized(sized)

    def _finish_sized(self, sized: set) -> None:
        """Replace the placeholder by the cached call of the size-only lines (sized.py), or inline them."""
        if not self.sized_call:
            return
        at = self.lines.index(self.sized_call[0])
        assigned = {line.split(" = ", 1)[0] for line in self.sized_lines if not line.startswith("#")}
        written = "\n".join(self.lines)
        outputs = set(self.graph.output_nodes())
        exports = [v for v in dict.fromkeys(self.expr.get(n) for n in self.graph.nodes if n in sized)
                   if v in assigned and (re.search(rf"(?<![\w.]){v}\b", written) or
                                         any(self.expr.get(o) == v for o in outputs))]
        if not exports or len(assigned) < MIN_CACHED_OPS:
            self.lines[at:at + 1] = self.sized_lines
            self.sized_lines, self.sized_call = [], []
            return
        self.sized_keys = [self.expr[n] for n in size_inputs(self.graph, sized)]
        self.sized_exports = exports
        targets = ", ".join(exports) + ("," if len(exports) == 1 else "")
        self.lines[at] = f"{targets} = self.{METHOD}({', '.join(self.sized_keys)})"

    def sized_method(self) -> str:
        """The text of the generated method that computes the size-only values once per size ('' if none)."""
        if not self.sized_call:
            return ""
        keys, exports = self.sized_keys, self.sized_exports
        key = "(" + ", ".join(keys) + ("," if len(keys) == 1 else "") + ")"
        values = ", ".join(exports) + ("," if len(exports) == 1 else "")
        body = [f'"""{", ".join(exports)}: they depend on the input sizes only, so they are computed once per '
                f'size and cached."""', f"key = {key}", f"if key not in self.{CACHE_ATTR}:"]
        body += [f"{_INDENT}{line}" for line in self.sized_lines]
        body += [f"{_INDENT}self.{CACHE_ATTR}[key] = ({values})", f"return self.{CACHE_ATTR}[key]"]
        return (f"\n    def {METHOD}(self{''.join(', ' + k for k in keys)}):\n"
                + "\n".join(f"{_INDENT * 2}{line}" for line in body) + "\n")

    def _render_loop(self, calls: List[Node], k: int, via_item: bool, last: Node) -> List[str]:
        owner = calls[0].target.rpartition(".")[0]
        args = self.call_args(calls[0])
        var = _variable(_canonical(last.name), self.taken)
        start = self.arg(args[k]).code
        codes = [var if p == k else self.arg(a).code for p, a in enumerate(args)]
        layer = _variable("layer", self.taken)
        self.expr[last] = var
        self.loops.append(self.full(owner))
        self.uses.append(MappingUse(type_name(type(self._torch(calls[0].target))),
                                    self.units[self.full(calls[0].target)].ctor.split("(")[0], calls[0].name,
                                    self.full(owner)))
        item = "[0]" if via_item else ""
        return [f"{var} = {start}", f"for {layer} in {_child_expr('self', owner, self.lists, self.prefix)}:",
                f"{_INDENT}{var} = {layer}({', '.join(codes)}){item}"]

    def returned(self, tuple_output: bool, unit: "_Unit") -> str:
        """The return expression; fills `unit`'s passthrough/kept/tuple_out (outputs that are inputs are left
        to the caller)."""
        parts = []
        inputs = [self.expr[n] for n in self.graph.inputs]
        for i, value in enumerate(self.graph.outputs):
            if isinstance(value, Node) and value in self.failed:  # its problem is already reported
                unit.kept.append(i)
                parts.append("None")
                continue
            try:
                code = self.arg(value).code
            except Unsupported as exc:
                self.problems.append(f"output: {exc}")
                continue
            if tuple_output and self.prefix and code in inputs and len(self.graph.outputs) > 1:
                unit.passthrough[i] = inputs.index(code)
                continue
            unit.kept.append(i)
            parts.append(code)
        unit.tuple_out = tuple_output and bool(self.prefix) and len(parts) > 1 or (
            tuple_output and bool(self.prefix) and not unit.passthrough)
        if unit.tuple_out:
            return f"({parts[0]},)" if len(parts) == 1 else ", ".join(parts)
        return parts[0] if len(parts) == 1 else ", ".join(parts)


_POSITION = re.compile(r"(^|_)(idx|index|id|number)$")
_NOT_HYPER = frozenset(_RESERVED) | frozenset(dir(builtins)) | frozenset(dir(nn.Cell))


def _hyperparameters(module: torch.nn.Module) -> Dict[str, float]:
    """The module's public float and int attributes (eps, scaling, nf, head_dim, ...); a module's position in
    its stack (`layer_idx`) is not one (it would make each layer's code differ where it equals a size). Each
    becomes an `__init__` argument and a Cell attribute of the same name, so names that would shadow a
    module-level name of the file or a builtin, or overwrite an attribute of nn.Cell, are not used (their
    values stay literals)."""
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and type(v) in (float, int)
            and is_identifier(k) and not _POSITION.search(k) and k not in _NOT_HYPER}


def _hyper_name(value: Any, hyper: Dict[str, Any], sizes: bool) -> Optional[str]:
    """The one hyper-parameter `value` stands for: a float other than 0/1/-1 anywhere, a whole number of at
    least 3 only inside a size list or a parameter shape (smaller ones are too often plain dimensions)."""
    if type(value) is float:
        if value in (0.0, 1.0, -1.0):
            return None
    elif type(value) is int:
        if not sizes or value < 3:
            return None
    else:
        return None
    names = [k for k, v in hyper.items() if type(v) is type(value) and v == value]
    return names[0] if len(names) == 1 else None


def _params(module: torch.nn.Module) -> Dict[str, ParamSpec]:
    found = {}
    for name, p in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
        trainable = isinstance(p, torch.nn.Parameter) and p.requires_grad
        found[name] = ParamSpec(tuple(p.shape), p.dtype, trainable)
    return found


_CLASS_RESERVED = frozenset(_RESERVED) | {"Module", "Cell"}


def _safe_class_name(name: str) -> str:
    name = re.sub(r"\W", "_", name)
    return name + "Cell" if name in _RESERVED or name in ("Module", "Cell") or not is_identifier(name) else name


def generate_modules(trace: ModuleTrace, root_module: torch.nn.Module, class_name: str,
                     checkpoint_name: str) -> ModuleCode:
    """The module source (see module docstring) of a traced model; problems are collected, not raised."""
    programs = trace.programs
    code = ModuleCode("", class_name)
    units: Dict[str, _Unit] = {}
    # a list with parameters of its own (the ParametrizationList of a weight-normed layer the forward never calls:
    # original0/1) is a class holding them, not an nn.CellList
    lists = {p for p, prog in programs.items() if p and isinstance(prog.module, (torch.nn.ModuleList,))
             and prog.graph is None and not _params(prog.module)}
    bodies: Dict[Tuple[str, str], str] = {}  # (torch class, body text) -> class name
    class_info: Dict[str, GeneratedClass] = {}
    class_text: Dict[str, str] = {}
    taken_names = {class_name}  # class names: unique, valid, shadowing nothing of the file (naming.identifier)
    moe_paths = [p for p, prog in programs.items() if prog.moe is not None]
    for path in sorted(programs, key=lambda p: -p.count(".") - (1 if p else 0)):  # children before parents
        if any(path.startswith(f"{p}.") for p in moe_paths):
            continue  # part of a block that became one MoE Cell
        prog = programs[path]
        module = prog.module
        mapping = lookup_module(module) if path else None
        if mapping is not None:
            try:
                ctor = mapping.build(module)
            except Unsupported as exc:
                code.problems.append(f"{type_name(type(module))} at {path!r}: {exc}")
                ctor = "None"
            units[path] = _Unit(ctor, leaf_params=dict(mapping.params), relaid=tuple(mapping.relaid),
                                identity=isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p == 0)
            code.layers[path] = mapping.ms_name
            continue
        if path in lists:
            children = [units[f"{path}.{n}"].ctor for n, _ in module.named_children()]
            if children and len(set(children)) == 1:
                ctor = f"nn.CellList([{children[0]} for _ in range({len(children)})])"
            else:
                ctor = "nn.CellList([" + ", ".join(children) + "])"
            units[path] = _Unit(ctor)
            continue
        if prog.moe is not None:
            inputs = [i for i, n in enumerate(prog.graph.inputs if prog.graph is not None else [])
                      if isinstance(n.example, torch.Tensor)]
            if len(inputs) != 1:
                code.problems.append(f"{prog.moe.torch_type} at {path!r}: called with {len(inputs)} tensor inputs; "
                                     "the MoE Cell takes one")
            scores = None  # where the Cell returns the router scores: None (the output alone), "first", "last"
            if prog.moe.returns_scores and prog.graph is not None:
                # the exported block's outputs as its callers index them (torch.export keeps the used ones, in
                # the order it made them)
                shapes = [tuple(getattr(n.example, "shape", ())) for n in prog.graph.output_nodes()]
                hidden_at = [i for i, shape in enumerate(shapes) if len(shape) != 2 or shape[-1] != prog.moe.top_k]
                if len(hidden_at) != 1 or len(shapes) > 2:
                    code.problems.append(f"{prog.moe.torch_type} at {path!r}: returns outputs of shapes {shapes}; "
                                         "expected the hidden states, and the [tokens, top_k] router scores if used")
                elif len(shapes) == 2:
                    scores = "first" if hidden_at == [1] else "last"
            text = moe_class_source(prog.moe, scores)
            key = (type(module).__name__, text)
            if key not in bodies:
                name = identifier(_safe_class_name(type(module).__name__), taken_names, _CLASS_RESERVED, suffix="")
                bodies[key] = name
                class_text[name] = text.replace("class __CLASS__(", f"class {name}(", 1)
                class_info[name] = GeneratedClass(name, prog.moe.torch_type, [], ["hidden", "ffn_hidden",
                                                                                   "num_experts", "top_k",
                                                                                   "**options"],
                                                  class_text[name].count("\n") + 1)
            name = bodies[key]
            class_info[name].paths.append(path)
            spec = prog.moe
            options = "".join(f", {k}={v!r}" for k, v in spec.moe_options().items())
            # gpt-oss's block returns (output, router scores): callers index the Cell's tuple as torch's
            outputs = [0, 1] if scores is not None else []
            units[path] = _Unit(f"{name}(hidden={spec.hidden}, ffn_hidden={spec.ffn_hidden}, "
                                f"num_experts={spec.num_experts}, top_k={spec.top_k}{options})",
                                kept=outputs, tuple_out=bool(outputs), inputs=inputs[:1])
            code.layers[path] = "mindspore_hyper.moe.MoE"
            code.moe_blocks.append(path)
            continue
        if isinstance(module, torch.nn.ModuleDict):  # a container (never called): nn.CellDict under the same keys
            ctors = [(name, units[f"{path}.{name}"].ctor) for name, _ in module.named_children()]
            members = ", ".join(f"{name!r}: {ctor}" for name, ctor in ctors)
            # MindSpore's CellDict refuses containers (CellList, CellDict) as members: the parametrizations of a
            # weight-normed layer the forward never calls (Wav2Vec2-Conformer's unused positional convolution) hold
            # a plain ParametrizationList; then the Module helper holds them under the same names
            nested = any(ctor.startswith(("nn.CellList(", "nn.CellDict(", "Module(")) for _, ctor in ctors)
            units[path] = _Unit(f"Module(**{{{members}}})" if nested else f"nn.CellDict({{{members}}})")
            continue
        fixed = _FixedDims(class_name, tuple(trace.static)) if path == "" else None
        unit, text, hyper_used, fallback = _generate_class(prog, units, lists, code, fixed)
        if fallback is not None:
            code.fallbacks.append({"module": path, "torch": type_name(type(module)), "reason": fallback})
        torch_cls = type(module).__name__
        key = (torch_cls, text)
        if path == "":
            name = class_name
        elif key in bodies:
            name = bodies[key]
        else:
            name = identifier(_safe_class_name(torch_cls), taken_names, _CLASS_RESERVED, suffix="")
            bodies[key] = name
            class_text[name] = text.replace("class __CLASS__(", f"class {name}(", 1)
            class_info[name] = GeneratedClass(name, type_name(type(module)), [], list(hyper_used),
                                              class_text[name].count("\n") + 1)
        if path == "":
            class_text[name] = text.replace("class __CLASS__(", f"class {name}(", 1)
            class_info[name] = GeneratedClass(name, type_name(type(module)), [], list(hyper_used),
                                              class_text[name].count("\n") + 1)
        class_info[name].paths.append(path)
        hyper = _hyperparameters(module)
        args = ", ".join(f"{h}={render_literal(hyper[h])}" for h in hyper_used)
        unit.ctor = f"{name}({args})"
        units[path] = unit
        for name_, value in prog.constants.items():
            code.buffers[f"{path}.{name_}" if path else name_] = value
    _ties_and_buffers(root_module, programs, code)
    root_text = class_text.pop(class_name)
    if code.ties:
        tie_lines = "\n".join(f"{_INDENT * 2}{_cell_attr(alias, programs, lists)} = {_cell_attr(owner, programs, lists)}"
                              for alias, owner in code.ties)
        root_text = root_text.replace("\n\n    def construct(", f"\n{_INDENT * 2}# tied weights: one Parameter, "
                                      f"as in torch\n{tie_lines}\n\n    def construct(", 1)
    ordered = [class_text[n] for n in class_text] + [root_text]
    class_info[class_name].lines = root_text.count("\n") + 1
    code.classes = list(class_info.values())
    body = "\n\n\n".join(ordered)
    helper_text = "\n\n\n".join(inspect.getsource(helpers.HELPERS[h]).rstrip() for h in helpers.HELPERS
                                if re.search(rf"\b{h}\(" if h != "Module" else r"\bModule\(\*\*\{", body))
    dims = "; ".join(f"{name}: ({', '.join(s or 'static' for s in shape)})" for name, shape in trace.symbolic.items())
    code.source = module_source(
        f"{class_name}: {type_name(type(root_module))} converted to MindSpore by mindspore_hyper.migrate "
        f"(one class per torch module class).\n\n"
        f"Input dimensions (symbolic names, or static where torch.export specialised them): {dims}.",
        class_name, checkpoint_name, helper_text, body,
        extra_imports="from mindspore_hyper.moe import MoE\n" if code.moe_blocks else "")
    return code


def _generate_class(prog: ModuleProgram, units: Dict[str, _Unit], lists: set, code: ModuleCode,
                    fixed: Optional["_FixedDims"] = None) -> Tuple[_Unit, str, List[str], Optional[str]]:
    """(unit, class text, hyper-parameters, None) of one module; when its class cannot be generated (the text
    does not compile, the generator fails, or a call or output of its own cannot be expressed), its faithful
    traced body instead (no hyper-parameters, loops or size cache: the module's own ops as traced), with the
    reason as the last item. Problems the traced body shares (an unmapped op) are left in `code.problems`."""
    marks = (len(code.problems), len(code.uses), len(code.loops))
    unit = _Unit("")
    try:
        text, hyper_used = _class_body(prog, units, lists, code, unit, fixed=fixed)
        failed = code.problems[marks[0]:]
        if not failed:
            compile(text, f"<class of {prog.path or '(root)'}>", "exec")
            return unit, text, hyper_used, None
        reason = "its class could not be generated: " + "; ".join(failed)
    except SyntaxError as exc:
        reason = (f"its generated class does not compile: SyntaxError: {exc.msg} (class line {exc.lineno}: "
                  f"{(exc.text or '').strip()})")
    except Exception as exc:  # noqa: BLE001 - a generator failure costs this module its class, nothing else
        reason = f"generating its class failed: {type(exc).__name__}: {exc}"
    first = list(code.problems[marks[0]:])
    del code.problems[marks[0]:], code.uses[marks[1]:], code.loops[marks[2]:]
    unit = _Unit("")
    try:
        text, hyper_used = _class_body(prog, units, lists, code, unit, plain=True, fixed=fixed)
        compile(text, f"<traced body of {prog.path or '(root)'}>", "exec")
    except Exception as exc:  # noqa: BLE001
        code.problems += first or [f"{type_name(type(prog.module))} at {prog.path!r}: {reason}; its traced body "
                                   f"failed too: {type(exc).__name__}: {exc}"]
        return unit, "class __CLASS__(nn.Cell):\n    pass", [], None
    if code.problems[marks[0]:]:  # the traced body has the same problems (unmapped ops): report those
        return unit, text, hyper_used, None
    return unit, text, hyper_used, reason


def _class_body(prog: ModuleProgram, units: Dict[str, _Unit], lists: set, code: ModuleCode,
                unit: _Unit, plain: bool = False, fixed: Optional["_FixedDims"] = None) -> Tuple[str, List[str]]:
    """The class text (named __CLASS__) of one module, and the hyper-parameters its code uses (`plain`: the
    traced body, sizes and values as literals, no loops or size-only cache). The root (`prog.path` empty) takes
    its hyper-parameters with their traced values as defaults, so `build()` makes it without arguments, and
    its construct first checks the input dimensions `fixed` lists."""
    module, path = prog.module, prog.path
    init: List[str] = []
    hyper = {} if plain else _hyperparameters(module)
    shape_hyper: List[str] = []
    for name, spec in _params(module).items():
        text = _param_code(spec)
        dims = [_hyper_name(d, hyper, sizes=True) for d in spec.shape]
        if any(dims):
            shape_hyper += [d for d in dict.fromkeys(dims) if d and d not in shape_hyper]  # each name once
            shape = ", ".join(f"self.{d}" if d else str(v) for d, v in zip(dims, spec.shape))
            text = text.replace(render_literal(tuple(spec.shape)), f"({shape}{',' if len(dims) == 1 else ''})", 1)
        init.append(f"{member_access('self', name)} = {text}" if is_identifier(name)
                    else f"setattr(self, {name!r}, {text})")
    for name, value in prog.constants.items():
        spec = ParamSpec(tuple(value.shape), value.dtype, False)
        init.append(f"{member_access('self', name)} = {_param_code(spec)}  # a constant of the torch program")
    for name, _ in module.named_children():
        ctor = units[f"{path}.{name}" if path else name].ctor
        init.append(f"self.{name} = {ctor}" if is_identifier(name) else f"setattr(self, {name!r}, {ctor})")
    hyper_used: List[str] = []
    construct = ""
    if prog.graph is not None:
        for node in prog.graph.nodes:
            node.name = _canonical(node.name)
        forward = _ClassForward(prog, units, lists, hyper, plain=plain)
        forward.render()
        returned = forward.returned(prog.tuple_output, unit)
        code.problems += forward.problems
        code.uses += forward.uses
        code.loops += forward.loops
        hyper_used = list(forward.used_hyper)
        inputs = [forward.expr[n] for n in prog.graph.inputs]
        checks = fixed.lines({str(n.target): forward.expr[n] for n in prog.graph.inputs}) if fixed else []
        body = checks + forward.lines + [f"return {returned}"]
        construct = (f"\n\n    def construct(self{''.join(', ' + v for v in inputs)}):\n"
                     + "\n".join(f"{_INDENT * 2}{line}" if line else "" for line in body) + "\n")
        construct += forward.sized_method()
        if forward.sized_call:
            init.append(f"self.{CACHE_ATTR} = {{}}  # sizes -> the values {METHOD} computed for them")
    hyper_used = list(dict.fromkeys(hyper_used + shape_hyper))  # unique arguments by construction
    for h in reversed(hyper_used):
        init.insert(0, f"self.{h} = {h}")
    signature = "".join(f", {h}" if path else f", {h}={render_literal(hyper[h])}" for h in hyper_used)
    init_text = "\n".join(f"{_INDENT * 2}{line}" for line in ["super().__init__()"] + init)
    doc = f'    """{type_name(type(module))} converted from PyTorch{" (its traced body)" if plain else ""}."""\n\n'
    text = f"class __CLASS__(nn.Cell):\n{doc}    def __init__(self{signature}):\n{init_text}{construct}"
    return text.rstrip("\n"), hyper_used


@dataclass(frozen=True)
class _FixedDims:
    """The input dimensions torch.export fixed (specialised to the example's size because the model computes
    with their value, e.g. Python ints from the sequence length): the root's construct checks them first, so
    another size is refused with their names instead of failing later in an op or giving another computation."""

    class_name: str
    static: Tuple[Tuple[str, int, int], ...]  # (input name as the exported program names it, dimension, size)

    def lines(self, variables: Dict[str, str]) -> List[str]:
        """The check lines, given input name -> construct argument (an input the construct lacks is unused,
        so its size cannot change the result: no check). A tuple slice of the shape, not an index, so an input
        of lower rank gets the same message."""
        out: List[str] = []
        for name, dim, size in self.static:
            var = variables.get(name)
            if var is None:
                continue
            shown = name if name == var else f"{name} (argument {var})"
            out += [f"if tuple({var}.shape)[{dim}:{dim + 1}] != ({size},):",
                    f"{_INDENT}raise ValueError(f\"{self.class_name}: input {shown} has shape {{tuple({var}.shape)}}; "
                    f"its dimension {dim} must be {size}: torch.export fixed it at the example's size because the "
                    f"model computes with its value (Python numbers from it, or a weight's shape), so this code holds "
                    f"that size only; where the model allows another, convert again with an example of it\")"]
        if out:
            out.insert(0, "# input dimensions torch.export fixed (report.static): another size is refused")
        return out


def _cell_attr(torch_name: str, programs: Dict[str, ModuleProgram], lists: set) -> str:
    owner, _, name = torch_name.rpartition(".")
    prog = programs.get(owner)
    mapping = lookup_module(prog.module) if prog is not None and owner else None
    if mapping is not None:
        name = mapping.params[name]
    base = _child_expr("self", owner, lists, "") if owner else "self"
    return member_access(base, name)


def _ties_and_buffers(root: torch.nn.Module, programs: Dict[str, ModuleProgram], code: ModuleCode) -> None:
    """Tied parameters (one Parameter under both names) and the buffers torch's state_dict lacks."""
    first: Dict[int, str] = {}
    for name, p in root.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(p), name)
        if owner != name:
            code.ties.append((name, owner))
    for path, prog in programs.items():
        skip = getattr(prog.module, "_non_persistent_buffers_set", set())
        mapping = lookup_module(prog.module) if path else None
        for name, b in prog.module.named_buffers(recurse=False):
            if name in skip and mapping is None:
                code.buffers[f"{path}.{name}" if path else name] = b.detach().clone()
