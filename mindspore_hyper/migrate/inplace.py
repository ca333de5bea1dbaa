"""In-place torch ops (`x += y`, `add_`, `relu(inplace=True)`) become out-of-place ones.

Generated MindSpore code never mutates a tensor, so `x.add_(y)` becomes `z = x + y` and every
later read of `x` reads `z`. That is exact unless other tensors alias `x`: an in-place update of a
model input, a parameter/buffer, a view, or a tensor that has views, is refused with its location.
"""
from __future__ import annotations

import operator
from typing import Any, List, Optional, Tuple

import torch

from mindspore_hyper.migrate.graph import Graph, Node
from mindspore_hyper.migrate.mappings import lookup_function
from mindspore_hyper.migrate.mappings.registry import method

__all__ = ["rewrite_inplace", "op_name"]

_INPLACE_OPERATORS = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                      operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
                      operator.iand: operator.and_, operator.ior: operator.or_}
_VIEWS = {"view", "reshape", "permute", "transpose", "t", "unsqueeze", "squeeze", "expand", "expand_as", "slice",
          "select", "narrow", "as_strided", "alias", "detach", "getitem", "flatten", "unflatten", "view_as",
          "split", "split_with_sizes", "chunk", "unbind", "diagonal", "swapaxes", "movedim", "contiguous"}


def op_name(node: Node) -> str:
    """The bare op name of a function node: "add_", "view", "getitem"."""
    target = node.target
    if isinstance(target, tuple) and target[0] == "method":
        return target[1]
    return getattr(target, "__name__", str(target))


def _out_of_place(node: Node) -> Optional[Any]:
    """The out-of-place key of an in-place call (None if the call is not in place or has no mapping)."""
    target = node.target
    if target in _INPLACE_OPERATORS:
        return _INPLACE_OPERATORS[target]
    if node.kwargs.get("inplace") is True:
        return target
    name = op_name(node)
    if name.startswith("__i") and name.endswith("__"):
        key = getattr(torch.ops.aten, "__" + name[3:], None)
    elif not name.endswith("_") or name.startswith("_") or name.endswith("__"):
        return None
    elif isinstance(target, tuple):
        key = method(name[:-1])
    else:
        key = getattr(torch.ops.aten, name[:-1], None)
    return key if key is not None and lookup_function(key) is not None else None


def _mutated(node: Node) -> Any:
    if node.args:
        return node.args[0]
    return node.kwargs.get("self", node.kwargs.get("input"))


def rewrite_inplace(graph: Graph) -> Tuple[List[str], List[str]]:
    """Rewrite in-place calls in `graph` (see module docstring).

    Returns:
        (notes, problems): one note per rewritten call; one problem per refused call (with location).
    """
    notes, problems = [], []
    position = {n: i for i, n in enumerate(graph.nodes)}
    users = graph.users()
    for node in list(graph.nodes):
        if node.op != "function":
            continue
        key = _out_of_place(node)
        if key is None:
            continue
        target = _mutated(node)
        if not isinstance(target, Node):
            continue
        what = f"in-place {node.display} on `{target.name}`"
        late_views = [u for u in users.get(target, []) if position[u] < position[node] and u.op == "function"
                      and op_name(u) in _VIEWS and any(position[v] > position[node] for v in users.get(u, []))]
        if target.op in ("input", "attr", "constant"):
            problems.append(f"{what}: updates a model input, parameter or buffer in place ({node.where()})")
        elif target.op == "function" and op_name(target) in _VIEWS:
            problems.append(f"{what}: updates a view of another tensor in place ({node.where()})")
        elif late_views:
            problems.append(f"{what}: views of it taken before the update are read after it ({node.where()})")
        else:
            node.target = key
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "inplace"}
            graph.replace_uses(target, node, after=node)
            notes.append(f"{what} rewritten as out-of-place ({node.where()})")
    return notes, problems
