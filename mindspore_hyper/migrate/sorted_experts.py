"""Experts over tokens sorted by expert (JetMoE), computed shape-generally while exporting.

JetMoE's router (`JetMoeTopKGating`) sorts the chosen (token, expert) pairs by expert and returns how many rows
each expert gets as a Python list (`expert_size.tolist()`); its experts (`JetMoeParallelExperts`) split the sorted
rows by those sizes and apply expert e's weight (E, out, in) to its slice. Reading the sizes back to Python
(`aten.item`) makes the program data-dependent: torch.export records the sizes of one batch and a Cell cannot
read a tensor back at all.

While exporting, the two classes run the same computation with the sizes kept a tensor: the router returns
`expert_size` as the tensor it summed (not `tolist()`), and the experts give row i the expert e(i) = the number
of cumulative sizes <= i (the sorted rows of expert e are those from sizes[:e].sum() to sizes[:e+1].sum()),
computing every expert on every row and keeping the chosen one by a 0/1 weight (exact: the other terms are
zeros; E times the expert FLOPs). Every other op of the routing (top-k, scatter, sort, gather, index_add) is
traced as written.

A pair is computed so only after both were checked on the inputs they received in one torch run: the router's
outputs equal to the original's (the sizes as a tensor equal to the list), the experts' output within 1e-5
relative of the original's (both sides float32; the same products, one matrix product per expert in place of
one per slice). Routers and experts that differ are left as written (and their `aten.item` is refused with its
name).
"""
from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Dict, Iterator, List, Tuple

import torch

__all__ = ["sorted_experts_modules", "verify_sorted", "sorted_forwards", "choose_sorted", "VERIFY_TOLERANCE"]

VERIFY_TOLERANCE = 1e-5  # relative, as moe_blocks.verify_dense
_ROUTERS = ("JetMoeTopKGating",)
_EXPERTS = ("JetMoeParallelExperts",)


def sorted_experts_modules(root: torch.nn.Module) -> Dict[str, torch.nn.Module]:
    """Routers and experts of `root` of the sorted-experts kind (by class): path -> module."""
    return {p: m for p, m in root.named_modules() if type(m).__name__ in _ROUTERS + _EXPERTS}


def tensor_sizes_router(self, hidden_states: torch.Tensor):
    """JetMoeTopKGating.forward with `expert_size` kept a tensor [E] (the original returns its `tolist()`)."""
    logits = self.layer(hidden_states).float()  # [T, E]
    top_k_logits, top_k_indices = logits.topk(self.top_k, dim=1)  # [T, k]
    top_k_gates = torch.softmax(top_k_logits, dim=1).type_as(hidden_states)
    zeros = torch.zeros([top_k_gates.size(0), self.num_experts], dtype=top_k_gates.dtype, device=top_k_gates.device)
    gates = zeros.scatter(1, top_k_indices, 1)  # [T, E]
    expert_size = gates.long().sum(0)  # [E]
    _, index_sorted_experts = top_k_indices.flatten().sort(0)  # [T k]
    batch_index = index_sorted_experts.div(self.top_k, rounding_mode="trunc")
    batch_gates = top_k_gates.flatten()[index_sorted_experts]
    return index_sorted_experts, batch_index, batch_gates, expert_size, logits


def tensor_sizes_experts(self, inputs: torch.Tensor, expert_size: torch.Tensor) -> torch.Tensor:
    """JetMoeParallelExperts.forward for rows `inputs` [N, in] sorted by expert, `expert_size` a tensor [E]:
    row i goes through expert e(i) (see the module docstring) -> [N, out]."""
    num_experts = self.weight.shape[0]
    ends = torch.cumsum(expert_size, 0)  # [E]: one past each expert's last row
    rows = torch.arange(inputs.shape[0], device=inputs.device)
    expert = (rows[:, None] >= ends[None, :]).sum(1)  # [N]
    chosen = (expert[:, None] == torch.arange(num_experts, device=inputs.device)).to(inputs.dtype)  # [N, E]
    every = torch.matmul(inputs.unsqueeze(0), self.weight.transpose(1, 2))  # [E, N, out]
    return (every * chosen.transpose(0, 1)[:, :, None]).sum(0)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def verify_sorted(root: torch.nn.Module, modules: Dict[str, torch.nn.Module], args, kwargs) -> Dict[str, str]:
    """Run `root` once (as written); beside every call of a router or experts module, compute its tensor-sizes
    form on the same inputs. Returns path -> why, for the modules whose form differs, cannot be computed, or that
    were not called (a router must give equal outputs, the sizes as a tensor equal to the list; experts within
    VERIFY_TOLERANCE relative)."""
    from mindspore_hyper.migrate.lowering import preserved_buffers

    why: Dict[str, str] = {}
    called: set = set()
    hooks = []
    for path, module in modules.items():
        def hook(mod, a, k, out, path=path):
            called.add(path)
            try:
                if type(mod).__name__ in _ROUTERS:
                    got = tensor_sizes_router(mod, *a, **k)
                    ok = len(got) == len(out) and all(
                        _same(g.tolist() if i == 3 else g, o) for i, (g, o) in enumerate(zip(got, out)))
                    problem = "" if ok else "its tensor-sizes form gives other routing outputs"
                else:
                    inputs, sizes = (list(a) + list(k.values()))[:2]
                    got = tensor_sizes_experts(mod, inputs, torch.tensor(sizes, dtype=torch.long))
                    scale = float(out.abs().max()) if out.numel() else 1.0
                    error = float((got - out).abs().max()) / (scale or 1.0) if out.numel() else 0.0
                    problem = "" if got.shape == out.shape and error <= VERIFY_TOLERANCE else \
                        f"its tensor-sizes form differs from its forward ({error:.1e} relative)"
            except Exception as exc:  # noqa: BLE001 - another signature or layout
                problem = f"its tensor-sizes form does not apply ({type(exc).__name__}: {exc})"
            why[path] = why.get(path) or problem
        hooks.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad(), preserved_buffers(root):
            root(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    refused = {p: why[p] for p in modules if p in called and why[p]}
    refused.update({p: "not called in the example forward" for p in modules if p not in called})
    return refused


@contextmanager
def sorted_forwards(modules: Dict[str, torch.nn.Module]) -> Iterator[None]:
    """Inside the body, each router and experts module of `modules` runs its tensor-sizes form."""
    for module in modules.values():
        form = tensor_sizes_router if type(module).__name__ in _ROUTERS else tensor_sizes_experts
        module.forward = types.MethodType(form, module)
    try:
        yield
    finally:
        for module in modules.values():
            del module.forward


def choose_sorted(root: torch.nn.Module, args, kwargs) -> Tuple[Dict[str, torch.nn.Module], List[str]]:
    """The sorted-experts modules of `root` to run in their tensor-sizes form, and notes for the report: all of
    them when every one verifies (a router's tensor sizes must reach experts that take a tensor), else none."""
    modules = sorted_experts_modules(root)
    if not modules:
        return {}, []
    refused = verify_sorted(root, modules, args, kwargs)
    if refused:
        return {}, [f"{p} ({type(modules[p]).__name__}) left as written (its expert sizes are read back to Python): "
                    f"{why}" for p, why in refused.items()]
    kinds = sorted({type(m).__name__ for m in modules.values()})
    return modules, [f"{len(modules)} modules ({', '.join(kinds)}): expert sizes kept a tensor, each sorted row "
                     "through every expert with the non-chosen weighted 0 (exact, E times the expert FLOPs)"]
