"""In-place torch ops (`x += y`, `add_`, `relu(inplace=True)`) become out-of-place ones.

Generated MindSpore code never mutates a tensor, so `x.add_(y)` becomes `z = x + y` and every
later read of `x` reads `z`. That is exact unless other tensors alias `x`: an in-place update of a
model input, a parameter/buffer, a view, or a tensor that has views, is refused with its location.
An update of a view is rewritten out of place when it is seen only through that view (nothing reads the
tensor the program created, or its other views, after it: Funnel's `positional_attn *= cls_mask`). Another
aliasing case is rewritten too: a write into one slice or select of a tensor the program
created itself (`k = x.new_empty(...); k[..., :8].copy_(a)`, DeepSeek-V3's key expansion) becomes
`k2 = slice_scatter(k, a, ...)` (the slice's new value put into a copy of the whole), later reads of
`k` read `k2` and later reads of the slice read its new value; a slice of a select (or any chain of them,
`a[..., i, :i] = r`: Gated DeltaNet's forward substitution) becomes one scatter per link of the chain.
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
_SCATTERS = {"slice": torch.ops.aten.slice_scatter, "select": torch.ops.aten.select_scatter}
# conversions that return their input itself when nothing changes (`x.to(x.dtype)` is x): a write into a slice
# of their result may write into a model input, so it is not rewritten
_MAY_RETURN_INPUT = {"to", "type", "type_as", "float", "double", "half", "int", "long", "bool", "bfloat16"}
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
    if op_name(node) == "copy_":
        return torch.ops.aten.copy
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
        elif target.op == "function" and op_name(target) in _VIEWS and _write_unseen(graph, node, target, position,
                                                                                      users):
            node.target = key
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "inplace"}
            graph.replace_uses(target, node, after=node)
            notes.append(f"{what} (a view of a tensor the program created, which nothing reads afterwards but "
                         f"through this view) rewritten as out-of-place ({node.where()})")
        elif target.op == "function" and op_name(target) in _SCATTERS:
            refused = _write_into_slice(graph, node, key, target, what)
            if refused:
                problems.append(refused)
            else:
                notes.append(f"{what} (a slice of a tensor the program created) rewritten as a scatter into a copy "
                             f"({node.where()})")
            position = {n: i for i, n in enumerate(graph.nodes)}
            users = graph.users()
        elif target.op == "function" and op_name(target) in _VIEWS and not _item_of_fresh_tuple(target):
            problems.append(f"{what}: updates a view of another tensor in place ({node.where()})")
        elif late_views:
            problems.append(f"{what}: views of it taken before the update are read after it ({node.where()})")
        else:
            node.target = key
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "inplace"}
            graph.replace_uses(target, node, after=node)
            notes.append(f"{what} rewritten as out-of-place ({node.where()})")
    return notes, problems


def _write_unseen(graph: Graph, node: Node, view: Node, position, users) -> bool:
    """Whether `node`, an in-place update of `view`, is seen only through `view`: the view chain starts at a
    tensor the program created (not an input, parameter, buffer or a conversion that may return its input), and
    neither that tensor nor any other view of it taken before the update is read after it or returned (Funnel's
    `positional_attn *= cls_mask` on a slice of a reshape of an einsum). Then the out-of-place op, read by the
    view's later readers, is exact: what the write changes in the base is never read."""
    root = view
    while isinstance(root, Node) and root.op == "function" and op_name(root) in _VIEWS and \
            not _item_of_fresh_tuple(root):
        root = _mutated(root)
    if not isinstance(root, Node) or root.op != "function" or op_name(root) in _MAY_RETURN_INPUT:
        return False
    aliases = [root] + _views_before(root, node, position, users)
    outputs = set(graph.output_nodes())
    for alias in aliases:
        if alias is view:
            continue
        if alias in outputs or any(position[u] > position[node] for u in users.get(alias, [])):
            return False
    return True


def _write_into_slice(graph: Graph, node: Node, key: Any, view: Node, what: str) -> Optional[str]:
    """Rewrite `node`, an in-place update of `view` (a slice or select, possibly of slices and selects, of a
    tensor the program created), as the view's new value followed by scatters of it into copies of each view up
    the chain and of the whole (`a[..., i, :i] = r`, a slice of a select: Gated DeltaNet's forward
    substitution); None, or why it is refused."""
    chain, base = [view], _mutated(view)
    while isinstance(base, Node) and base.op == "function" and op_name(base) in _SCATTERS:
        chain.append(base)  # `k[:, 0]` exports as select(slice(k, 0), 1, 0); `a[..., i, :i]` as slice(select(a))
        base = _mutated(base)
    if not isinstance(base, Node) or base.op != "function" or op_name(base) in _VIEWS | _MAY_RETURN_INPUT:
        return (f"{what}: updates a view of a model input, parameter, buffer, another view or a conversion that may "
                f"return its input in place ({node.where()})")
    position = {n: i for i, n in enumerate(graph.nodes)}
    users = graph.users()
    if any(position[v] > position[node] for u in _views_before(base, node, position, users) if u not in chain
           for v in users.get(u, [])):
        return f"{what}: other views of `{base.name}` taken before the update are read after it ({node.where()})"
    if op_name(node) == "copy_":
        source = node.args[1] if len(node.args) > 1 else node.kwargs.get("src")  # aten calls: by name
        shapes = [getattr(getattr(v, "example", None), "shape", None) for v in (source, view)]
        if not isinstance(source, Node) or shapes[0] is None or shapes[0] != shapes[1]:
            return f"{what}: copies a value of another shape (a broadcast) into a slice ({node.where()})"
        value = source
    else:
        node.target = key
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "inplace"}
        value = node
    # new values up the chain: a whole slice (`x[:]`) is its parent, so the parent's new value is its own
    renewed, last, below = [], node, value
    for child, parent in zip(chain, chain[1:] + [base]):
        if not _whole_slice(child):
            below = _scatter(graph, parent, below, child, last, node)
            last = below
        renewed.append((parent, below))
    graph.replace_uses(view, value, after=node)  # later reads of the view, of the views up the chain, of the base
    for old, new in renewed:
        graph.replace_uses(old, new, after=last)
    if value is not node:
        graph.replace_uses(node, value, after=node)
        graph.nodes.remove(node)
    return None


def _scatter(graph: Graph, parent: Node, value: Node, view: Node, after: Node, node: Node) -> Node:
    """A slice_scatter or select_scatter node of `value` into a copy of `parent` at `view`'s place (view is a
    slice or select of parent), inserted after `after`."""
    kind = op_name(view)
    names = ("dim", "start", "end", "step") if kind == "slice" else ("dim", "index")
    where = dict(zip(names, view.args[1:]))
    where.update({k: v for k, v in view.kwargs.items() if k in names})
    scatter = Node(name=_fresh_name(graph, f"{parent.name}_written"), op="function", target=_SCATTERS[kind],
                   kwargs={"self": parent, "src": value, **where}, scope=node.scope,
                   scope_type=node.scope_type, location=node.location, example=getattr(parent, "example", None),
                   display=f"aten.{kind}_scatter")
    graph.nodes.insert(graph.nodes.index(after) + 1, scatter)
    return scatter


def _views_before(base: Node, node: Node, position, users) -> List[Node]:
    """Every view of `base` (views of views included) taken before `node`."""
    found, todo = [], [base]
    while todo:
        for u in users.get(todo.pop(), []):
            if u.op == "function" and op_name(u) in _VIEWS and position[u] < position[node] and u not in found:
                found.append(u)
                todo.append(u)
    return found


def _item_of_fresh_tuple(node: Node) -> bool:
    """`getitem` of the tuple a non-view op returned (`torch.topk(x, k)[0]`): a tensor of its own, not a view."""
    if op_name(node) != "getitem" or not node.args or not isinstance(node.args[0], Node):
        return False
    source = node.args[0]
    return source.op == "function" and isinstance(source.example, (tuple, list)) and op_name(source) not in _VIEWS


def _whole_slice(node: Node) -> bool:
    """A slice of a whole dimension (`x[:]`): the same tensor."""
    if node.op != "function" or op_name(node) != "slice":
        return False
    named = dict(zip(("self", "dim", "start", "end", "step"), node.args), **node.kwargs)
    return named.get("start") in (None, 0) and named.get("end") in (None, 2 ** 63 - 1) and named.get("step", 1) == 1


def _fresh_name(graph: Graph, stem: str) -> str:
    taken = {n.name for n in graph.nodes}
    name, k = stem, 1
    while name in taken:
        k += 1
        name = f"{stem}_{k}"
    return name
