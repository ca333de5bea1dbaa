"""Tracing with torch.fx: mapped torch.nn modules stay whole (call_module), everything else is
traced through to torch functions and Tensor methods; shapes stay symbolic (x.shape[0])."""
from __future__ import annotations

import inspect
from typing import Any, Dict, Sequence

import torch
import torch.fx

from mindspore_hyper.migrate.graph import Graph
from mindspore_hyper.migrate.lowering import Lowering, record_values, type_name
from mindspore_hyper.migrate.mappings import lookup_module
from mindspore_hyper.migrate.mappings.registry import method

__all__ = ["trace_fx", "bind_inputs"]


class _LeafTracer(torch.fx.Tracer):
    """Modules with a MindSpore mapping are leaves; every other module is traced through."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return lookup_module(m) is not None


def bind_inputs(module: torch.nn.Module, args: Sequence[Any], kwargs: Dict[str, Any]) -> inspect.BoundArguments:
    """Bind the example inputs to `module.forward`'s parameters.

    Raises:
        TypeError: the inputs do not fit the forward signature (the message names it).
    """
    signature = inspect.signature(module.forward)
    try:
        return signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"example inputs do not fit {type(module).__name__}.forward{signature}: {exc}") from None


def _non_persistent(module: torch.nn.Module) -> set:
    names = set()
    for prefix, sub in module.named_modules():
        for name in getattr(sub, "_non_persistent_buffers_set", ()):
            names.add(f"{prefix}.{name}" if prefix else name)
    return names


def trace_fx(module: torch.nn.Module, args: Sequence[Any], kwargs: Dict[str, Any]) -> Graph:
    """Trace `module` with torch.fx and lower it (raises whatever torch.fx raises when it cannot trace)."""
    bound = bind_inputs(module, args, kwargs)
    signature = inspect.signature(module.forward)
    concrete = {name: p.default for name, p in signature.parameters.items()
                if name not in bound.arguments and p.default is not inspect.Parameter.empty}
    tracer = _LeafTracer()
    tracer.record_stack_traces = True
    fx_graph = tracer.trace(module, concrete_args=concrete or None)
    gm = torch.fx.GraphModule(tracer.root, fx_graph)
    placeholders = [n for n in fx_graph.nodes if n.op == "placeholder"]
    names = list(signature.parameters)
    run_inputs = [bound.arguments[name] if name in bound.arguments else concrete[name]
                  for name in names[:len(placeholders)]]
    values = record_values(gm, run_inputs, module)

    constants = _non_persistent(module)
    low = Lowering(values)
    for fx_node, name in zip(placeholders, names):
        if name in concrete:
            low.add(fx_node, "constant", display=f"argument {name}={concrete[name]!r}")
        else:
            low.add(fx_node, "input", target=name)
    output = None
    for fx_node in fx_graph.nodes:
        if fx_node.op == "get_attr":
            is_state = fx_node.target in dict(module.named_parameters()) or (
                fx_node.target in dict(module.named_buffers()) and fx_node.target not in constants)
            low.add(fx_node, "attr" if is_state else "constant", target=fx_node.target,
                    display=f"attribute {fx_node.target}")
        elif fx_node.op == "call_module":
            sub = module.get_submodule(fx_node.target)
            low.add(fx_node, "module", fx_node.target, low.args(fx_node.args), low.args(fx_node.kwargs),
                    display=type_name(type(sub)), scope=low.scope(fx_node, outer=1))
        elif fx_node.op == "call_function":
            low.add(fx_node, "function", fx_node.target, low.args(fx_node.args), low.args(fx_node.kwargs))
        elif fx_node.op == "call_method":
            key = method(fx_node.target)
            low.add(fx_node, "function", key, low.args(fx_node.args), low.args(fx_node.kwargs))
        elif fx_node.op == "output":
            output = fx_node.args[0]
    return low.graph(output, "torch.fx", [], specialized=False)
