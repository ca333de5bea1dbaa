"""Tracing with torch.export (for models torch.fx cannot trace, e.g. transformers models).

torch.export records aten ops with the torch module stack of each; the ops that ran inside one
call of a mapped leaf module (nn.Linear, nn.BatchNorm2d, ...) are regrouped into one module call,
so the Cell keeps MindSpore's own layers. Shapes are specialised to the example inputs.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.fx
from torch.export.graph_signature import InputKind, OutputKind

from mindspore_hyper.migrate.errors import UnsupportedOpError
from mindspore_hyper.migrate.graph import Graph, Node, node_refs
from mindspore_hyper.migrate.lowering import Lowering, output_names, record_values, type_name
from mindspore_hyper.migrate.mappings import lookup_module
from mindspore_hyper.migrate.trace_fx import bind_inputs

__all__ = ["trace_export", "leafspec_warning_silenced"]


def _schema_kwargs(target: Any, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """aten calls by argument name (their schema's), so mappings bind them unambiguously."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return args, kwargs
    named = {a.name: v for a, v in zip(schema.arguments, args)}
    named.update(kwargs)
    return (), named


def _leaf_call(fx_node: torch.fx.Node, root: torch.nn.Module) -> Optional[Tuple[str, str, str, str]]:
    """(call key, module path, caller's path, caller's class) of the outermost mapped leaf module
    on the node's stack, or None."""
    caller, caller_cls = "", ""
    for key, (path, cls) in (fx_node.meta.get("nn_module_stack") or {}).items():
        if path and lookup_module(root.get_submodule(path)) is not None:
            return key, path, caller, caller_cls
        if path:
            caller, caller_cls = path, (cls if isinstance(cls, str) else cls.__qualname__).rsplit(".", 1)[-1]
    return None


def _group_leaf_calls(graph: Graph, leaf_of: Dict[Node, Tuple[str, str, str, str]], root: torch.nn.Module,
                      tied: Dict[str, str]) -> List[str]:
    """Replace the ops of each mapped leaf-module call by one "module" node; returns problems."""
    problems: List[str] = []
    users = graph.users()
    graph_outputs = set(graph.output_nodes())
    i = 0
    while i < len(graph.nodes):
        node = graph.nodes[i]
        if node not in leaf_of:
            i += 1
            continue
        key, path, caller, caller_cls = leaf_of[node]
        j = i
        while j < len(graph.nodes) and leaf_of.get(graph.nodes[j], (None,))[0] == key:
            j += 1
        group = graph.nodes[i:j]
        members = set(group)
        own = {f"{path}.{name}" for name, _ in root.get_submodule(path).named_parameters()} | {
            f"{path}.{name}" for name, _ in root.get_submodule(path).named_buffers()}
        inputs: List[Node] = []
        for n in group:
            for ref in node_refs((n.args, n.kwargs)):
                if ref in members or ref in inputs:
                    continue
                if ref.op == "attr" and tied.get(ref.target, ref.target) in {tied.get(o, o) for o in own}:
                    continue
                inputs.append(ref)
        outputs = [n for n in group if any(u not in members for u in users.get(n, [])) or n in graph_outputs]
        module_type = type_name(type(root.get_submodule(path)))
        if len(inputs) != 1 or len(outputs) != 1:
            problems.append(f"{module_type} at {path!r}: its traced ops take {len(inputs)} input(s) and give "
                            f"{len(outputs)} output(s); a mapped module call needs one of each "
                            f"({group[-1].where()})")
            i = j
            continue
        out = outputs[0]
        call = Node(name=out.name, op="module", target=path, args=(inputs[0],), scope=caller, scope_type=caller_cls,
                    location=out.location, example=out.example, display=module_type)
        graph.nodes[i:j] = [call]
        graph.replace_uses(out, call)
        for n in group:
            leaf_of.pop(n, None)
        i += 1
    return problems


def _tied_names(root: torch.nn.Module) -> Dict[str, str]:
    """Parameter name -> the first name of the same tensor (tied weights share one name)."""
    first: Dict[int, str] = {}
    result = {}
    for name, p in root.named_parameters(remove_duplicate=False):
        result[name] = first.setdefault(id(p), name)
    return result


@contextlib.contextmanager
def leafspec_warning_silenced() -> Iterator[None]:
    """Inside: no FutureWarning "`isinstance(treespec, LeafSpec)` is deprecated", which torch 2.13
    prints from its own deepcopies of pytree specs in `torch.export.export` and
    `torch.export.unflatten` (no call of ours can avoid it; issue 42: no warning from the package's
    own calls). Other warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                category=FutureWarning)
        yield


def trace_export(module: torch.nn.Module, args: Sequence[Any], kwargs: Dict[str, Any]) -> Graph:
    """Export `module` on the example inputs and lower it; leaf-module calls are regrouped.

    Raises:
        UnsupportedOpError: the export graph updates an input or has a leaf module that cannot be regrouped.
    """
    bound = bind_inputs(module, args, kwargs)
    with leafspec_warning_silenced():
        ep = torch.export.export(module, tuple(args), kwargs=dict(kwargs), strict=False)
    signature = ep.graph_signature
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    params, buffers = dict(module.named_parameters(remove_duplicate=False)), dict(module.named_buffers())
    run_inputs = []
    for spec in signature.input_specs:
        if spec.kind == InputKind.PARAMETER:
            run_inputs.append(params[spec.target].detach().clone())
        elif spec.kind == InputKind.BUFFER:
            run_inputs.append(buffers[spec.target].detach().clone())
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            run_inputs.append(ep.constants[spec.target])
        elif spec.kind == InputKind.USER_INPUT and spec.arg.name in bound.arguments:
            run_inputs.append(bound.arguments[spec.arg.name])
        else:
            raise UnsupportedOpError([f"export input {spec.arg.name!r} of kind {spec.kind.name} (nested or "
                                      "non-tensor model inputs are not supported)"])
    values = record_values(ep.graph_module, run_inputs, module)

    low = Lowering(values)
    for spec, fx_node in zip(signature.input_specs, placeholders):
        if spec.kind == InputKind.USER_INPUT:
            low.add(fx_node, "input", target=spec.arg.name)
        elif spec.kind == InputKind.CONSTANT_TENSOR or spec.kind == InputKind.BUFFER and not spec.persistent:
            low.add(fx_node, "constant", target=spec.target, display=f"constant {spec.target}")
        else:
            low.add(fx_node, "attr", target=spec.target, display=f"attribute {spec.target}")
    leaf_of: Dict[Node, Tuple[str, str, str, str]] = {}
    output = None
    for fx_node in ep.graph.nodes:
        if fx_node.op == "call_function":
            target = getattr(fx_node.target, "overloadpacket", fx_node.target)
            fargs, fkwargs = _schema_kwargs(fx_node.target, low.args(fx_node.args), low.args(fx_node.kwargs))
            node = low.add(fx_node, "function", target, fargs, fkwargs)
            leaf = _leaf_call(fx_node, module)
            if leaf is not None:
                leaf_of[node] = leaf
        elif fx_node.op == "output":
            output = fx_node.args[0]
    kinds = [s.kind for s in signature.output_specs]
    if any(k != OutputKind.USER_OUTPUT for k in kinds):
        mutated = [s.target for s in signature.output_specs if s.kind != OutputKind.USER_OUTPUT]
        raise UnsupportedOpError([f"the exported program updates {', '.join(map(str, mutated))} in place outside "
                                  "a mapped module (not supported)"])
    names = output_names(ep.module_call_graph[0].signature.out_spec) if ep.module_call_graph[0].signature else None
    graph = low.graph(list(output), "torch.export", [], specialized=True, names=names)
    problems = _group_leaf_calls(graph, leaf_of, module, _tied_names(module))
    if problems:
        raise UnsupportedOpError(problems)
    # Parameters/buffers read only inside regrouped module calls disappear with them.
    used = set(node_refs([(n.args, n.kwargs) for n in graph.nodes])) | set(graph.output_nodes())
    graph.nodes = [n for n in graph.nodes if n.op not in ("attr", "constant") or n in used]
    return graph
