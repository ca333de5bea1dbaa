"""Run-time assertions on tensor values in an exported program, dropped.

`assert lengths.max().item() <= seq_len` (Flaubert, XLM) exports as `aten.item` of a reduction, a comparison of
the resulting unbacked symbol and `aten._assert_scalar`. The value feeds nothing but the check, so the computation
does not depend on it; only the check needs a tensor read back to Python (`item`), which a Cell cannot trace. The
chain (the assertion and every node that only it uses) is removed and the report names its source line: the Cell
does not repeat the check, so inputs that would fail it are not refused. Assertions on values the computation also
uses are left alone (their `item` is refused by the lowering with its location).
"""
from __future__ import annotations

from typing import List, Set

import torch
import torch.fx

__all__ = ["drop_value_assertions"]

_ITEM = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)


def _reaches_item(node: torch.fx.Node) -> bool:
    """Whether `node` depends on a tensor value read back to Python (an `item`); iterative, as the condition may
    read the output of a deep network."""
    seen: Set[torch.fx.Node] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if current in seen or current.op != "call_function":
            continue
        if current.target in _ITEM:
            return True
        seen.add(current)
        pending.extend(current.all_input_nodes)
    return False


def drop_value_assertions(graph_module: torch.fx.GraphModule) -> List[str]:
    """Remove every `aten._assert_scalar` whose condition reads a tensor value, with the nodes only it used
    (in place).

    Returns:
        One note per removed assertion (its source line when the trace recorded one).
    """
    graph = graph_module.graph
    notes: List[str] = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten._assert_scalar.default:
            continue
        if not node.args or not isinstance(node.args[0], torch.fx.Node) or not _reaches_item(node.args[0]):
            continue
        trace = (node.meta.get("stack_trace") or "").strip().splitlines()
        where = trace[-1].strip() if trace else str(node.args[1] if len(node.args) > 1 else node.name)
        pending = list(node.all_input_nodes)
        graph.erase_node(node)
        while pending:  # what only the assertion used: the comparison, the item, the reduction it read
            inner = pending.pop()
            if inner.op == "call_function" and not inner.users and inner in graph.nodes:
                pending.extend(inner.all_input_nodes)
                graph.erase_node(inner)
        notes.append(f"a run-time assertion on tensor values dropped ({where}); the Cell does not check it")
    if notes:
        graph.lint()
        graph_module.recompile()
    return notes
