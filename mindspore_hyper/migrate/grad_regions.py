"""`with torch.no_grad():` regions of an exported program, inlined.

torch.export keeps such a region as one `wrap_with_set_grad_enabled(False, submodule, *inputs)` call of a
nested graph module; the lowering reads calls of ops, not nested graphs. The region's ops are copied into
the enclosing graph in place of the call, and each tensor it returns is passed through `aten.detach`
(generated as `ops.stop_gradient`): no gradient flows back through the region, as in torch. A region that
enables gradients inside a no-grad context (`enabled=True`) is kept as is, and the lowering refuses it.
"""
from __future__ import annotations

import operator
from typing import List

import torch

__all__ = ["inline_grad_regions"]


def inline_grad_regions(graph_module: torch.fx.GraphModule) -> List[str]:
    """Inline every `wrap_with_set_grad_enabled(False, ...)` call of `graph_module` (in place).

    Returns:
        One note per inlined region (its submodule and the source line that opened it).
    """
    hop = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    notes: List[str] = []
    graph = graph_module.graph
    for node in list(graph.nodes):
        if hop is None or node.op != "call_function" or node.target is not hop or node.args[0] is not False:
            continue
        holder = node.args[1]  # the get_attr node of the region's submodule
        region = getattr(graph_module, holder.target)
        env = {}
        placeholders = [n for n in region.graph.nodes if n.op == "placeholder"]
        env.update(zip(placeholders, node.args[2:]))
        results = None
        with graph.inserting_before(node):
            for inner in region.graph.nodes:
                if inner.op == "placeholder":
                    continue
                if inner.op == "output":
                    results = inner.args[0]
                    break
                env[inner] = graph.node_copy(inner, lambda n: env[n])
            outputs = []
            for value in (results if isinstance(results, (tuple, list)) else (results,)):
                copied = env[value] if isinstance(value, torch.fx.Node) else value
                if isinstance(copied, torch.fx.Node) and isinstance(copied.meta.get("val"), torch.Tensor):
                    detached = graph.call_function(torch.ops.aten.detach.default, (copied,))
                    # the detach belongs to the scope that opened the region, not to the module that computed the
                    # value: placed inside that module's program it would cut the gradient of every call of the
                    # module, with or without no_grad (HRM's L_module)
                    detached.meta = {**copied.meta, "nn_module_stack": dict(node.meta.get("nn_module_stack") or {}),
                                     "stack_trace": node.meta.get("stack_trace")}
                    copied = detached
                outputs.append(copied)
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(outputs[user.args[1]])
                graph.erase_node(user)
        if node.users:  # the region's value used whole (a single output)
            node.replace_all_uses_with(outputs[0])
        graph.erase_node(node)
        if not holder.users:
            graph.erase_node(holder)
            delattr(graph_module, holder.target)
        notes.append(f"a torch.no_grad() region ({holder.target}) inlined; its outputs carry no gradient")
    if notes:
        graph.lint()
        graph_module.recompile()
    return notes
