"""Values that depend only on input sizes (causal masks, position ids), computed once per size.

torch.export keeps the batch and sequence dimensions symbolic, so a mask built from
`torch.arange(seq)` cannot be folded into a constant at conversion time (fold.py); written inline
it would be rebuilt on every call (GPT-2's causal mask is ~40 small ops, a third of the model's
forward in PyNative). The module-structured code generator instead moves such a subgraph into a
method of the generated class that computes it once per distinct tuple of sizes and caches the
result on the Cell (`self._sized_cache`, keyed by the sizes).

A node is size-only when it is a deterministic function op with a tensor value whose operands are
constants, size-only nodes, or Python numbers derived only from `x.shape[d]` reads. Parameters and
buffers are state (a checkpoint or the user may change them), so nothing computed from them is
cached; random ops never are.
"""
from __future__ import annotations

from typing import List, Set

import torch

from mindspore_hyper.migrate.fold import deterministic
from mindspore_hyper.migrate.graph import Graph, Node, node_refs

__all__ = ["MIN_CACHED_OPS", "CACHE_ATTR", "METHOD", "size_only_nodes", "size_inputs"]

MIN_CACHED_OPS = 2  # a smaller size-only subgraph stays inline (the cache lookup costs about one op)
CACHE_ATTR = "_sized_cache"
METHOD = "_sized_values"


def _is_size(node: Node, sizes: Set[Node]) -> bool:
    """A Python number read from, or computed only from, tensor shapes."""
    if node.op != "function" or isinstance(node.example, torch.Tensor):
        return False
    if node.target is torch.ops.aten.sym_size:
        return True
    return deterministic(node) and all(r in sizes or r.op == "constant" for r in node_refs((node.args, node.kwargs)))


def size_only_nodes(graph: Graph) -> Set[Node]:
    """The tensor-valued nodes of `graph` computable from input sizes and constants alone.

    Empty unless there are at least MIN_CACHED_OPS of them and every size they read is computed
    before the first of them (the generated call goes where the first one was).
    """
    sizes: Set[Node] = set()
    found: Set[Node] = set()
    for node in graph.nodes:
        if _is_size(node, sizes):
            sizes.add(node)
        elif node.op == "function" and isinstance(node.example, torch.Tensor) and deterministic(node) and \
                all(r in found or r in sizes or r.op == "constant" for r in node_refs((node.args, node.kwargs))):
            found.add(node)
    if len(found) < MIN_CACHED_OPS:
        return set()
    order = {n: i for i, n in enumerate(graph.nodes)}
    first = min(order[n] for n in found)
    if any(order[r] > first for r in size_inputs(graph, found)):
        return set()
    return found


def size_inputs(graph: Graph, found: Set[Node]) -> List[Node]:
    """The size nodes (outside `found`) the size-only nodes read, in graph order: the cache key."""
    refs = {r for n in found for r in node_refs((n.args, n.kwargs)) if r not in found and r.op != "constant"}
    return [n for n in graph.nodes if n in refs]
