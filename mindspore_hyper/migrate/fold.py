"""Constant folding: ops whose inputs are all known at conversion time (masks built from
torch.arange, position ids, ...) are computed once by torch; their values become Cell constants.

Random ops never fold. Parameters and persistent buffers are state, not constants (a checkpoint
may change them), so nothing computed from them folds.
"""
from __future__ import annotations

from typing import List, Set

import torch

from mindspore_hyper.migrate.graph import Graph, Node, node_refs
from mindspore_hyper.migrate.inplace import op_name
from mindspore_hyper.migrate.mappings import lookup_function

__all__ = ["deterministic", "fold_constants"]

_RANDOM = ("rand", "bernoulli", "dropout", "normal", "multinomial", "uniform", "poisson", "randperm")


def deterministic(node: Node) -> bool:
    """Whether the op gives the same value on every call with the same inputs (not random): foldable, cacheable."""
    mapping = lookup_function(node.target)
    if mapping is not None:
        return mapping.foldable
    overloads = [getattr(node.target, o) for o in getattr(node.target, "overloads", lambda: [])()]
    if any(torch.Tag.nondeterministic_seeded in o.tags for o in overloads):
        return False
    return not any(word in op_name(node).lower() for word in _RANDOM)


def fold_constants(graph: Graph) -> List[str]:
    """Fold constant subgraphs in place; returns one note per constant the Cell will hold."""
    constant: Set[Node] = set()
    for node in graph.nodes:
        if node.op == "constant":
            constant.add(node)
        elif node.op == "function" and deterministic(node) and all(r in constant for r in node_refs((node.args, node.kwargs))):
            constant.add(node)
    needed: Set[Node] = set()
    for node in graph.nodes:
        if node not in constant:
            needed.update(r for r in node_refs((node.args, node.kwargs)) if r in constant)
    needed.update(n for n in graph.output_nodes() if n in constant)
    notes = []
    for node in (n for n in graph.nodes if n in needed):
        if node.op == "function":
            notes.append(f"{node.name}: {node.display} computed at conversion time ({node.where()})")
            node.op, node.args, node.kwargs = "constant", (), {}
    graph.nodes = [n for n in graph.nodes if n not in constant or n in needed]
    return notes
