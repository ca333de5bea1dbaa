"""Lowering a torch.fx graph (from torch.fx or torch.export) into the migration Graph.

Shared by both tracers: each node gets its torch source location, the module scope it ran in and
its value on the example inputs (an interpreter run on copies of the buffers, so tracing never
changes the model's BatchNorm statistics).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.fx
import torch.utils._pytree as pytree

from mindspore_hyper.migrate.graph import Graph, Node, SourceLocation
from mindspore_hyper.migrate.mappings.registry import torch_name

__all__ = ["Lowering", "preserved_buffers", "record_values", "output_names", "type_name"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


@contextlib.contextmanager
def preserved_buffers(module: torch.nn.Module) -> Iterator[None]:
    """Run the body, then put every buffer of `module` back to its value before (BatchNorm statistics); a buffer the
    body replaced by one of another shape (Wav2Vec2-Conformer's relative positions, extended for a longer input)
    gets the saved tensor back."""
    saved = {name: b.detach().clone() for name, b in module.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in module.named_buffers():
                if name not in saved:
                    continue
                if b.shape == saved[name].shape:
                    b.copy_(saved[name])
                else:
                    owner, _, attr = name.rpartition(".")
                    setattr(module.get_submodule(owner) if owner else module, attr, saved[name])


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.values: Dict[torch.fx.Node, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        self.values[n] = result
        return result


def record_values(gm: torch.fx.GraphModule, inputs: Sequence[Any], owner: torch.nn.Module) -> Dict[torch.fx.Node, Any]:
    """Every node's value when `gm` runs on `inputs` (no autograd; `owner`'s buffers restored afterwards)."""
    recorder = _Recorder(gm)
    with torch.no_grad(), preserved_buffers(owner):
        recorder.run(*inputs)
    return recorder.values


def type_name(cls: type) -> str:
    """`torch.nn.Linear` for torch.nn classes, else `module.Class`."""
    if getattr(torch.nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def output_names(spec: Any) -> List[str]:
    """A readable name per pytree leaf of an output structure (dict keys / field names / indices)."""
    leaves = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    names = []
    for path, _ in pytree.tree_flatten_with_path(leaves)[0]:
        parts = []
        for key in path:
            for attr in ("key", "idx", "name"):
                if hasattr(key, attr):
                    parts.append(str(getattr(key, attr)))
                    break
        names.append(".".join(parts) or "output")
    return names


class Lowering:
    """Builds migration Nodes from torch.fx nodes, keeping a torch.fx.Node -> Node map."""

    def __init__(self, values: Dict[torch.fx.Node, Any]):
        self.values = values
        self.map: Dict[torch.fx.Node, Node] = {}
        self.nodes: List[Node] = []

    @staticmethod
    def location(fx_node: torch.fx.Node) -> Optional[SourceLocation]:
        return SourceLocation.from_stack_trace(fx_node.meta.get("stack_trace") or fx_node.stack_trace, (_TORCH_DIR,))

    @staticmethod
    def scope(fx_node: torch.fx.Node, outer: int = 0) -> Tuple[str, str]:
        """(module path, class name) of the innermost module on the node's stack (skipping `outer` levels)."""
        stack = list((fx_node.meta.get("nn_module_stack") or {}).values())
        stack = stack[:len(stack) - outer] if outer else stack
        for path, cls in reversed(stack):
            if path:
                cls_name = cls if isinstance(cls, str) else cls.__qualname__
                return path, cls_name.rsplit(".", 1)[-1]
        return "", ""

    def args(self, value: Any) -> Any:
        """fx args with torch.fx.Nodes replaced by migration Nodes."""
        if isinstance(value, torch.fx.Node):
            return self.map[value]
        if isinstance(value, (tuple, list)):
            return type(value)(self.args(v) for v in value)
        if isinstance(value, dict):
            return {k: self.args(v) for k, v in value.items()}
        if isinstance(value, slice):
            return slice(self.args(value.start), self.args(value.stop), self.args(value.step))
        return value

    def add(self, fx_node: torch.fx.Node, op: str, target: Any = None, args: tuple = (), kwargs: Optional[dict] = None,
            display: str = "", scope: Optional[Tuple[str, str]] = None) -> Node:
        path, cls = scope if scope is not None else self.scope(fx_node)
        node = Node(name=fx_node.name, op=op, target=target, args=tuple(args), kwargs=dict(kwargs or {}),
                    scope=path, scope_type=cls, location=self.location(fx_node),
                    example=self.values.get(fx_node), display=display or (torch_name(target) if target else op))
        self.map[fx_node] = node
        self.nodes.append(node)
        return node

    def graph(self, outputs: Any, tracer: str, notes: List[str], specialized: bool,
              names: Optional[List[str]] = None) -> Graph:
        """The Graph; `outputs` is the output structure (its pytree leaves become the outputs)."""
        leaves, spec = pytree.tree_flatten(self.args(outputs))
        inputs = [n for n in self.nodes if n.op == "input"]
        return Graph(self.nodes, inputs, leaves, names or output_names(spec), tracer, notes, specialized)
