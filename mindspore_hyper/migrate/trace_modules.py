"""Module-structured tracing: torch.export with symbolic dimensions, unflattened to one graph per module.

`torch.export.export(..., dynamic_shapes=Dim.AUTO per dimension)` records the model with its batch
and sequence dimensions as symbols where the model allows it (export specialises the others and
says so), and `torch.export.unflatten` splits the program back into the torch module tree: each
module call becomes a graph of its own ops, calling its children. Each graph is lowered to the
migration Graph (lowering.py); a symbolic size a module receives as an argument is re-derived from
one of its tensor inputs (`x.shape[1]`) so generated signatures carry tensors only.
"""
from __future__ import annotations

import contextlib
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.fx
from torch.export.graph_signature import InputKind

from mindspore_hyper.migrate.complex_pairs import rewrite_complex
from mindspore_hyper.migrate.errors import UnsupportedOpError
from mindspore_hyper.migrate.graph import Graph
from mindspore_hyper.migrate.grad_regions import inline_grad_regions
from mindspore_hyper.migrate.inplace import rewrite_inplace
from mindspore_hyper.migrate.language_adapters import language_adapter_modules, masked_language_adapters
from mindspore_hyper.migrate.lowering import Lowering, output_names, preserved_buffers, type_name
from mindspore_hyper.migrate.mask_expansion import broadcast_masks, export_with_broadcast_masks
from mindspore_hyper.migrate.mappings import lookup_module
from mindspore_hyper.migrate.mappings.selective_scan import exported_scans
from mindspore_hyper.migrate.moe_blocks import (MoEBlockSpec, dense_experts_modules, dense_forwards,
                                                not_mapped_reason, recognize, verify_blocks, verify_dense)
from mindspore_hyper.migrate.moe_experts import decorated_dense, decorated_experts, verify_decorated
from mindspore_hyper.migrate.sorted_experts import choose_sorted, sorted_forwards
from mindspore_hyper.migrate.size_division import sizes_divided_as_sizes
from mindspore_hyper.migrate.trace_export import _schema_kwargs, leafspec_warning_silenced
from mindspore_hyper.migrate.trace_fx import bind_inputs
from mindspore_hyper.migrate.value_assertions import drop_value_assertions

__all__ = ["ModuleProgram", "ModuleTrace", "trace_modules"]

@dataclass
class ModuleProgram:
    """One torch module of the tree and (unless it is a mapped leaf or a container) its own program.

    Attributes:
        path: module path in the torch model ("" for the root).
        module: the torch module.
        graph: its lowered forward (None for mapped leaves, ModuleLists and modules never called).
        dropped_inputs: positions of its graph inputs that are symbolic sizes re-derived inside it
            (callers leave those arguments out).
        constants: attribute name -> value of tensors export lifted into this module (not torch
            parameters or buffers).
        tuple_output: its forward returns a tuple/list (callers index it), not one value.
        moe: the MoE spec when the module is a sparse MoE block mapped to mindspore_hyper.moe.MoE.
        input_order: the generated construct's inputs as positions among the traced ones (the torch
            forward's parameter order where the inputs could be matched to its parameters).
    """

    path: str
    module: torch.nn.Module
    graph: Optional[Graph] = None
    dropped_inputs: Tuple[int, ...] = ()
    constants: Dict[str, torch.Tensor] = field(default_factory=dict)
    tuple_output: bool = False
    input_order: Tuple[int, ...] = ()
    moe: Optional[MoEBlockSpec] = None


@dataclass
class ModuleTrace:
    """The traced model: every module's program, and which input dimensions stayed symbolic."""

    programs: Dict[str, ModuleProgram]
    symbolic: Dict[str, List[Optional[str]]]  # input name -> per-dimension symbol name (None: static)
    output_names: List[str]
    static: List[Tuple[str, int, int]] = field(default_factory=list)  # (input name, dimension, its fixed size)
    notes: List[str] = field(default_factory=list)
    rewritten: List[str] = field(default_factory=list)  # in-place ops made out-of-place


@contextlib.contextmanager
def _recording(values: Dict[torch.fx.Node, Any]) -> Iterator[None]:
    """Record every node value of every torch.fx.Interpreter run in the body (the unflattened modules run so)."""
    original = torch.fx.Interpreter.run_node

    def run_node(self, n):
        result = original(self, n)
        values[n] = result
        return result

    torch.fx.Interpreter.run_node = run_node
    try:
        yield
    finally:
        torch.fx.Interpreter.run_node = original


def _symbol(value: Any) -> Optional[str]:
    """The symbol of a symbolic size (None for a static one)."""
    if not isinstance(value, torch.SymInt) or getattr(value.node.expr, "is_number", False):
        return None
    return str(value.node.expr)


def _derivable_sizes(fx_graph: torch.fx.Graph) -> Dict[torch.fx.Node, Tuple[torch.fx.Node, int]]:
    """Symbolic-size placeholders -> (a tensor placeholder, dimension) whose size is that symbol."""
    placeholders = [n for n in fx_graph.nodes if n.op == "placeholder"]
    where: Dict[str, Tuple[torch.fx.Node, int]] = {}
    for p in placeholders:
        val = p.meta.get("val")
        if isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                sym = _symbol(size)
                if sym is not None:
                    where.setdefault(sym, (p, d))
    found = {}
    for p in placeholders:
        sym = _symbol(p.meta.get("val"))
        if sym is not None and sym in where:
            found[p] = where[sym]
    return found


def _tensor_attribute(root: torch.nn.Module, target: str, owner: str) -> torch.Tensor:
    """A detached copy of the tensor at the dotted attribute path `target` of `root`.

    Raises:
        UnsupportedOpError: the attribute is not a tensor (`owner` names whose attribute it is).
    """
    value = root
    for part in target.split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise UnsupportedOpError([f"attribute {target!r} of {owner} is a {type(value).__name__}, not a tensor"])
    return value.detach().clone()


def _children_of(gm: torch.nn.Module) -> Dict[str, torch.nn.Module]:
    return dict(gm.named_modules())


def trace_modules(module: torch.nn.Module, args: Sequence[Any], kwargs: Dict[str, Any],
                  dynamic: bool = True) -> ModuleTrace:
    """Export `module` (dimensions symbolic where the model allows) and lower each module's program.

    Args:
        module: the torch model.
        args, kwargs: example inputs of its forward.
        dynamic: make every input dimension symbolic where the model allows (False: the example shapes).

    Returns:
        The ModuleTrace.

    Raises:
        UnsupportedOpError: a later call of a shared module cannot be inlined (see _inline_call), or the program
            updates state.
        Exception: whatever torch.export raises for a model it cannot trace (the caller wraps it).
    """
    bind_inputs(module, args, kwargs)
    auto = torch.export.Dim.AUTO
    dims = None
    if dynamic:
        dims = {"args": tuple({d: auto for d in range(a.dim())} if isinstance(a, torch.Tensor) else None
                              for a in args),
                "kwargs": {k: ({d: auto for d in range(v.dim())} if isinstance(v, torch.Tensor) else None)
                           for k, v in kwargs.items()}}
        dims = _dynamic_shapes(module, dims)
    moe_blocks = {p: m for p, m in module.named_modules() if recognize(m) is not None}
    refused_blocks = verify_blocks(module, moe_blocks, args, kwargs) if moe_blocks else {}
    moe_blocks = {p: m for p, m in moe_blocks.items() if p not in refused_blocks}
    dense = dense_experts_modules(module, moe_blocks)
    refused = verify_dense(module, dense, args, kwargs) if dense else {}
    dense = {p: m for p, m in dense.items() if p not in refused}
    # experts of transformers' use_experts_implementation decorator (grouped_mm by default: histc, data-dependent
    # offsets) that the checks above did not take: computed densely through the decorator's flags (moe_experts)
    decorated = decorated_experts(module, {**moe_blocks, **dense})
    refused_decorated = verify_decorated(module, decorated, args, kwargs) if decorated else {}
    decorated = {p: m for p, m in decorated.items() if p not in refused_decorated}
    refused = {p: why for p, why in refused.items() if p not in decorated}
    dense_note = ("its experts computed densely (every token through every expert, the non-chosen weighted 0: exact, "
                  "E/k times the expert FLOPs), ")
    notes = [f"{p} ({type(m).__name__}): converted generically, "
             f"{dense_note if (f'{p}.experts' if p else 'experts') in dense else ''}not as mindspore_hyper.moe.MoE: "
             f"{not_mapped_reason(m)}" for p, m in module.named_modules() if not_mapped_reason(m)]
    notes += [f"{p} ({type(m).__name__}): converted generically, "
              f"{dense_note if (f'{p}.experts' if p else 'experts') in dense else ''}not as mindspore_hyper.moe.MoE: "
              f"{why} (MoE's formulation of it, moe_blocks.dense_forward)"
              for p, why in refused_blocks.items() for m in [module.get_submodule(p)]]
    notes += [f"{p} ({type(dense_m).__name__}) left as written (not computed densely): {why}"
              for p, why in {**refused, **refused_decorated}.items() for dense_m in [module.get_submodule(p)]]
    notes += [f"{p} ({type(m).__name__}): its experts implementation {m.config._experts_implementation!r} replaced "
              "by the dense formulation (every token through every expert, the non-chosen weighted 0: exact, E/k "
              "times the expert FLOPs)" for p, m in decorated.items()]
    # JetMoE's experts over rows sorted by expert: the sizes kept a tensor (sorted_experts.py)
    by_sizes, sorted_notes = choose_sorted(module, args, kwargs)
    notes += sorted_notes
    # X-MOD's adapters over the rows of each language: kept by where(), not selected (language_adapters.py)
    adapters, adapter_notes = language_adapter_modules(module, args, kwargs)
    notes += adapter_notes

    def export(broadcast: bool) -> torch.export.ExportedProgram:
        # Mamba's reference scan as one op, so its Python loop does not fix the length (mappings/selective_scan.py);
        # torch.div of sizes returns the size (size_division.py)
        with dense_forwards(moe_blocks, dense), decorated_dense(decorated), exported_scans(module), \
                sorted_forwards(by_sizes), broadcast_masks(broadcast), \
                masked_language_adapters(adapters), sizes_divided_as_sizes(), leafspec_warning_silenced():
            return torch.export.export(module, tuple(args), kwargs=dict(kwargs), dynamic_shapes=dims, strict=False)
    # transformers' masks from custom mask functions: broadcast, not vmapped, where exact (mask_expansion.py)
    ep, broadcast, mask_notes = export_with_broadcast_masks(export, module, args, kwargs)
    notes += mask_notes
    notes += inline_grad_regions(ep.graph_module)
    notes += drop_value_assertions(ep.graph_module)
    mapped_leaves = {p for p, m in module.named_modules() if p and lookup_module(m) is not None}
    # a mapped layer's own buffers (BatchNorm's running statistics in training) are updated by its MindSpore layer
    mutated = [s for s in ep.graph_signature.output_specs if s.kind.name != "USER_OUTPUT" and not (
        s.kind.name == "BUFFER_MUTATION" and str(s.target).rpartition(".")[0] in mapped_leaves)]
    if mutated:
        raise UnsupportedOpError([f"the exported program updates {', '.join(str(s.target) for s in mutated)} in "
                                  "place (not supported)"])
    symbolic: Dict[str, List[Optional[str]]] = {}
    static: List[Tuple[str, int, int]] = []
    user = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    placeholder_vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in user:
        val = placeholder_vals.get(spec.arg.name)
        if isinstance(val, torch.Tensor):
            symbolic[spec.arg.name] = [_symbol(s) for s in val.shape]
            static += [(spec.arg.name, d, int(s)) for d, s in enumerate(val.shape) if _symbol(s) is None]
    names = output_names(ep.module_call_graph[0].signature.out_spec) if ep.module_call_graph[0].signature else None
    with leafspec_warning_silenced():
        unflat = torch.export.unflatten(ep)
    values: Dict[torch.fx.Node, Any] = {}
    with torch.no_grad(), preserved_buffers(unflat), _recording(values):
        unflat(*args, **kwargs)
    # the same computation as exported, so the values match bitwise
    with dense_forwards(moe_blocks, dense), decorated_dense(decorated), exported_scans(module), \
            sorted_forwards(by_sizes), broadcast_masks(broadcast), \
            masked_language_adapters(adapters):
        call_args = _call_arguments(module, args, kwargs)
    torch_modules = dict(module.named_modules(remove_duplicate=False))
    unflat_modules = _children_of(unflat)
    programs: Dict[str, ModuleProgram] = {}
    layers = mapped_leaves | set(moe_blocks)  # module calls that become MindSpore layers, not generated classes
    problems: List[str] = []
    rewritten: List[str] = []
    for path, torch_mod in torch_modules.items():
        program = ModuleProgram(path, torch_mod, moe=recognize(torch_mod) if path in moe_blocks else None)
        programs[path] = program
        if any(path.startswith(f"{p}.") for p in moe_blocks):
            continue  # inside a block that becomes one MoE Cell
        um = unflat_modules.get(path)
        graph = getattr(um, "graph", None)
        if path and lookup_module(torch_mod) is not None:
            continue
        if um is None or graph is None:
            if type(um).__name__ == "InterpreterModuleDispatcher":
                problems.append(f"{type_name(type(torch_mod))} at {path!r} is called more than once per forward "
                                "(a shared module): not supported by the module-structured conversion")
            continue
        if isinstance(torch_mod, (torch.nn.ModuleList, torch.nn.ModuleDict)) and not any(
                n.op not in ("placeholder", "output") for n in graph.nodes):
            continue
        program.graph, program.dropped_inputs, program.constants, program.tuple_output = _lower(
            path, graph, um, torch_mod, values)
        program.input_order = _name_inputs(program.graph, call_args.get(path, {})) if path else tuple(
            range(len(program.graph.inputs)))
        done, refused = rewrite_inplace(program.graph)
        rewritten += done
        problems += refused
        done, refused = rewrite_complex(program.graph, root=not path, layer=lambda target, path=path: (
            f"{path}.{target}" if path else target) in layers)
        notes += done
        problems += refused
    if problems:
        raise UnsupportedOpError(problems)
    _simplify_calls(programs)
    root = programs[""]
    if root.graph is not None and names and len(names) == len(root.graph.outputs):
        root.graph.output_names = names
    return ModuleTrace(programs, symbolic, list(root.graph.output_names) if root.graph else [], static=static,
                       notes=notes, rewritten=rewritten)


def _call_arguments(module: torch.nn.Module, args: Sequence[Any], kwargs: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Module path -> {forward parameter name (`name0` for a tuple's items): value} of one torch run."""
    import inspect

    found: Dict[str, Dict[str, Any]] = {}
    hooks = []
    for path, sub in module.named_modules():
        def hook(mod, a, k, path=path):
            try:
                bound = inspect.signature(mod.forward).bind(*a, **k)
            except TypeError:
                return
            named = {}
            for name, value in bound.arguments.items():
                if isinstance(value, (tuple, list)):
                    named.update({f"{name}{i}": v for i, v in enumerate(value)})
                else:
                    named[name] = value
            found.setdefault(path, named)
        hooks.append(sub.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad(), preserved_buffers(module):
            module(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return found


def _name_inputs(graph: Graph, named: Dict[str, Any]) -> Tuple[int, ...]:
    """Name each graph input after the forward parameter holding the same tensor (else keep its name) and
    put them in the forward's order (unmatched ones last); returns the new order as old positions."""
    taken: Dict[str, int] = {}
    rank = {name: i for i, name in enumerate(named)}
    for node in graph.inputs:
        value = node.example
        if not isinstance(value, torch.Tensor):
            continue
        for name, arg in named.items():
            if name not in taken and isinstance(arg, torch.Tensor) and arg.shape == value.shape and \
                    arg.dtype == value.dtype and torch.equal(arg, value):
                node.target = name
                taken[name] = rank[name]
                break
    order = sorted(range(len(graph.inputs)),
                   key=lambda i: (taken.get(str(graph.inputs[i].target), len(rank)), i))
    graph.inputs = [graph.inputs[i] for i in order]
    return tuple(order)


def _simplify_calls(programs: Dict[str, ModuleProgram]) -> None:
    """Callers leave out the sizes a child re-derives and pass the rest in the child's input order."""
    for path, prog in programs.items():
        if prog.graph is None:
            continue
        graph = prog.graph
        for node in list(graph.nodes):
            if node.op != "module":
                continue
            child = programs.get(f"{path}.{node.target}" if path else node.target)
            if child is None or child.graph is None:
                continue
            args = [a for i, a in enumerate(node.args) if i not in child.dropped_inputs]
            node.args = tuple(args[i] for i in child.input_order)


def _dynamic_shapes(module: torch.nn.Module, dims: Dict[str, Any]) -> Any:
    """The dynamic_shapes argument for export: by parameter name of the forward."""
    import inspect

    spec = {}
    rest = list(dims["args"])
    for p in inspect.signature(module.forward).parameters.values():
        if not rest:
            break
        if p.kind is inspect.Parameter.VAR_POSITIONAL:  # forward(self, *inputs): one entry, a tuple
            spec[p.name], rest = tuple(rest), []
        elif p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            spec[p.name] = rest.pop(0)
    spec.update(dims["kwargs"])
    return spec


def _lower(path: str, fx_graph: torch.fx.Graph, owner: torch.nn.Module, torch_mod: torch.nn.Module,
           values: Dict[torch.fx.Node, Any]) -> Tuple[Graph, Tuple[int, ...], Dict[str, torch.Tensor], bool]:
    scope = (path, type(torch_mod).__name__)
    own = {n for n, _ in torch_mod.named_parameters()} | {n for n, _ in torch_mod.named_buffers()}
    low = Lowering(values)
    derivable = _derivable_sizes(fx_graph)
    dropped: List[int] = []
    constants: Dict[str, torch.Tensor] = {}
    deferred: List[Tuple[torch.fx.Node, torch.fx.Node, int]] = []
    output = None
    placeholder_index = 0
    inlined: Dict[torch.fx.Node, Any] = {}  # a later call of a shared module -> its outputs (indexable)
    for fx_node in fx_graph.nodes:
        if fx_node.op == "placeholder":
            if fx_node in derivable:
                dropped.append(placeholder_index)
                deferred.append((fx_node,) + derivable[fx_node])
            else:
                low.add(fx_node, "input", target=fx_node.target, scope=scope)
            placeholder_index += 1
            continue
        for sym_node, tensor, dim in deferred:  # after every placeholder: the tensor it reads exists
            low.add(sym_node, "function", torch.ops.aten.sym_size, (), {"self": low.map[tensor], "dim": dim},
                    scope=scope)
        deferred = []
        if fx_node.op == "get_attr":
            target = str(fx_node.target)
            if target not in own:
                constants[target] = _tensor_attribute(owner, target, type(torch_mod).__name__)
            low.add(fx_node, "attr", target=target, display=f"attribute {target}", scope=scope)
        elif fx_node.op == "call_module":
            child = str(fx_node.target).split("@")[0]
            called = owner.get_submodule(str(fx_node.target))
            if lookup_module(torch_mod.get_submodule(child)) is not None and _carries_sizes(called):
                result = _layer_call_with_sizes(low, fx_node, called, child, scope)
                if isinstance(result, list):
                    inlined[fx_node] = result
                else:
                    low.map[fx_node] = result
                continue
            if "@" in str(fx_node.target):  # unflatten's name for a later call of the same module
                if lookup_module(torch_mod.get_submodule(child)) is not None:  # a MindSpore layer: call it again
                    low.add(fx_node, "module", target=child, args=low.args(fx_node.args), display=child, scope=scope)
                else:  # its ops for this call, in the parent (the first call stays a call of the child's Cell)
                    result = _inline_call(low, fx_node, getattr(owner, str(fx_node.target)), child, scope, constants)
                    if isinstance(result, (list, tuple)):
                        inlined[fx_node] = result
                    else:
                        low.map[fx_node] = result
                continue
            low.add(fx_node, "module", target=str(fx_node.target), args=low.args(fx_node.args),
                    display=str(fx_node.target), scope=scope)
        elif fx_node.op == "call_function" and fx_node.target is operator.getitem and \
                isinstance(fx_node.args[0], torch.fx.Node) and fx_node.args[0] in inlined:
            low.map[fx_node] = inlined[fx_node.args[0]][fx_node.args[1]]  # an output of an inlined call
        elif fx_node.op == "call_function":
            if any(a in inlined for a in fx_node.all_input_nodes):
                raise UnsupportedOpError([f"{type(torch_mod).__name__} at {path!r} uses the outputs of a later call "
                                          "of a shared module other than by index (not supported)"])
            target = getattr(fx_node.target, "overloadpacket", fx_node.target)
            fargs, fkwargs = _schema_kwargs(fx_node.target, low.args(fx_node.args), low.args(fx_node.kwargs))
            low.add(fx_node, "function", target, fargs, fkwargs, scope=scope)
        elif fx_node.op == "output":
            output = fx_node.args[0]
            if any(a in inlined for a in fx_node.all_input_nodes):
                raise UnsupportedOpError([f"{type(torch_mod).__name__} at {path!r} returns the outputs of a later "
                                          "call of a shared module as a whole (not supported)"])
        else:
            raise UnsupportedOpError([f"graph node {fx_node.name} of kind {fx_node.op} in "
                                      f"{type(torch_mod).__name__} is not supported"])
    for sym_node, tensor, dim in deferred:  # a graph of placeholders only
        low.add(sym_node, "function", torch.ops.aten.sym_size, (), {"self": low.map[tensor], "dim": dim},
                scope=scope)
    graph = low.graph(output, "torch.export", [], specialized=False)
    return graph, tuple(dropped), constants, isinstance(output, (tuple, list))


def _is_tensor_node(node: torch.fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def _carries_sizes(child_gm: torch.nn.Module) -> bool:
    """True when the unflattened graph of a mapped layer's call also takes or returns symbolic sizes: export puts
    the size arithmetic of a symbolic shape in the scope of the module whose output first has that shape, so a
    BatchNorm after a strided convolution (SwiftFormer's embeddings, CvT's projections) receives the caller's
    sizes and returns `1 + (h - 1) // 2` beside its output."""
    graph = getattr(child_gm, "graph", None)
    if graph is None:
        return False
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.nodes if n.op == "output").args[0]
    outputs = list(output) if isinstance(output, (list, tuple)) else [output]
    return any(not _is_tensor_node(n) for n in placeholders + outputs if isinstance(n, torch.fx.Node))


def _layer_call_with_sizes(low: Lowering, call: torch.fx.Node, child_gm: torch.nn.Module, child: str,
                           scope: Tuple[str, str]) -> Any:
    """A mapped layer's call whose graph carries size arithmetic (see _carries_sizes): the arithmetic on the sizes
    is lowered into the caller's program and the layer is called on its tensor inputs. Returns the layer's call, or
    when the graph returns a list, its outputs in order (the parent indexes them): the lowered sizes, and the
    layer's call for its tensor output.

    Raises:
        UnsupportedOpError: the call's inputs do not match the graph's, or the graph returns other than one tensor
            besides the sizes it computes from its inputs.
    """
    graph = child_gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(call.args) or call.kwargs:
        raise UnsupportedOpError([f"the layer call {call.target!r} passes {len(call.args)} positional inputs to a "
                                  f"graph of {len(placeholders)} (keyword inputs: {sorted(call.kwargs)}): not "
                                  "supported"])
    tensors = [low.args(a) for p, a in zip(placeholders, call.args) if _is_tensor_node(p)]
    inputs = {p: low.args(a) for p, a in zip(placeholders, call.args)}
    low.map.update(inputs)
    sizes: Dict[torch.fx.Node, Any] = {p: v for p, v in inputs.items() if not _is_tensor_node(p)}
    for node in graph.nodes:  # size arithmetic: non-tensor call_functions of the inputs, sizes and constants
        if node.op == "call_function" and not _is_tensor_node(node) and all(
                a in sizes or a in inputs for a in node.all_input_nodes):
            target = getattr(node.target, "overloadpacket", node.target)
            fargs, fkwargs = _schema_kwargs(node.target, low.args(node.args), low.args(node.kwargs))
            sizes[node] = low.add(node, "function", target, fargs, fkwargs, scope=scope)
    output = next(n for n in graph.nodes if n.op == "output").args[0]
    outputs = list(output) if isinstance(output, (list, tuple)) else [output]
    results = [o for o in outputs if o not in sizes]
    if len(results) != 1 or not _is_tensor_node(results[0]):
        raise UnsupportedOpError([f"the layer call {call.target!r} returns {len(results)} values besides sizes "
                                  "(a mapped layer returns one tensor): not supported"])
    layer = low.add(results[0], "module", target=child, args=tuple(tensors), display=child, scope=scope)
    if not isinstance(output, (list, tuple)):
        return layer
    return [layer if o is results[0] else sizes[o] for o in outputs]


def _inline_call(low: Lowering, call: torch.fx.Node, child_gm: torch.nn.Module, child: str,
                 scope: Tuple[str, str], constants: Dict[str, torch.Tensor]) -> Any:
    """Lower the graph of a later call (`call`, unflatten's `child@n`) of the parent's module `child` into the
    parent's program: its inputs are the call's arguments, its parameters and buffers are read from the child
    (`self.child.weight`: the same Parameters the first call's Cell uses), its own constants become the parent's.
    A module called more than once per forward thus runs as in torch, whether or not its calls trace alike
    (ModernBERT's rotary embedding reads another inverse-frequency buffer on its second call). Returns the call's
    outputs (a node, or a list/tuple of nodes the parent indexes)."""
    graph = child_gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(call.args) or call.kwargs:
        raise UnsupportedOpError([f"the call {call.target!r} passes {len(call.args)} positional inputs to a graph "
                                  f"of {len(placeholders)} (keyword inputs: {sorted(call.kwargs)}): not supported"])
    for node, arg in zip(placeholders, call.args):
        low.map[node] = low.args(arg)
    outputs = None
    own = {n for n, _ in child_gm.named_parameters()} | {n for n, _ in child_gm.named_buffers()}
    for node in graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "get_attr":
            target = str(node.target)
            if target in own:
                low.add(node, "attr", target=f"{child}.{target}", display=f"attribute {child}.{target}", scope=scope)
            else:
                name = re.sub(r"\W", "_", f"{call.target}_{target}")
                constants[name] = _tensor_attribute(child_gm, target, f"the call {call.target!r}")
                low.add(node, "attr", target=name, display=f"attribute {name}", scope=scope)
        elif node.op == "call_module":
            if "@" in str(node.target):
                raise UnsupportedOpError([f"the call {call.target!r} calls its own module {node.target!r} again "
                                          "(a shared module inside a shared module): not supported"])
            low.add(node, "module", target=f"{child}.{node.target}", args=low.args(node.args),
                    display=f"{child}.{node.target}", scope=scope)
        elif node.op == "call_function":
            target = getattr(node.target, "overloadpacket", node.target)
            fargs, fkwargs = _schema_kwargs(node.target, low.args(node.args), low.args(node.kwargs))
            low.add(node, "function", target, fargs, fkwargs, scope=scope)
        elif node.op == "output":
            outputs = low.args(node.args[0])
        else:
            raise UnsupportedOpError([f"graph node {node.name} of kind {node.op} in the call {call.target!r} is "
                                      "not supported"])
    return outputs
