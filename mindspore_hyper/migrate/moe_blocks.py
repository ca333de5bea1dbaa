"""Sparse mixture-of-experts blocks of transformers models -> `mindspore_hyper.moe.MoE`.

A block is mapped when its semantics are MoE's exactly: router logits `x W^T`, softmax over the
experts (float32), the top-k probabilities renormalised to sum to 1, SwiGLU experts
(`silu(x Wg) * (x Wu)) Wd`) and no shared expert. transformers' `MixtralSparseMoeBlock`
(`MixtralTopKRouter` + `MixtralExperts`, SiLU, no router jitter) is such a block; the experts
become MoE's batched weights (`w_gate`, `w_up`, `w_down`), so expert parallelism applies.

torch.export cannot trace these blocks as written (their expert loop iterates over `nonzero()`),
so while exporting, a mapped block runs `dense_forward`: the same function computed for every
expert with the non-chosen gates zero (exact; traceable). Its traced ops are replaced by the MoE
Cell in the generated code.

A sparse block whose semantics differ (Qwen2-MoE: its shared expert's output is scaled by
`sigmoid(shared_expert_gate(x))`, which MoE's shared expert is not) is converted generically: only
its experts module (`...Experts(hidden, top_k_index, top_k_weights)`, the data-dependent loop) runs
`dense_experts` while exporting, so the generated code computes every expert for every token and
weights the non-chosen ones 0 (exact, E / k times the expert FLOPs); `not_mapped_reason` says why.
"""
from __future__ import annotations

import types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
import torch

__all__ = ["MoEBlockSpec", "recognize", "not_mapped_reason", "dense_experts_modules", "dense_forwards",
           "moe_weights", "moe_class_source"]


@dataclass(frozen=True)
class MoEBlockSpec:
    """A torch MoE block that converts to `MoE(hidden, ffn_hidden, num_experts, top_k)`."""

    torch_type: str
    hidden: int
    ffn_hidden: int
    num_experts: int
    top_k: int


def recognize(module: torch.nn.Module) -> Optional[MoEBlockSpec]:
    """The spec of a block with MoE's semantics (see module docstring), else None."""
    if type(module).__name__ != "MixtralSparseMoeBlock":
        return None
    gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
    if gate is None or experts is None or not hasattr(experts, "gate_up_proj") or not hasattr(experts, "down_proj"):
        return None
    if type(getattr(experts, "act_fn", None)).__name__ not in ("SiLUActivation", "SiLU"):
        return None
    if getattr(module, "jitter_noise", 0.0) and module.training:
        return None  # random router jitter in training: MoE has logit noise, not input jitter
    num_experts, two_f, hidden = experts.gate_up_proj.shape
    return MoEBlockSpec(f"{type(module).__module__}.{type(module).__qualname__}", hidden, two_f // 2, num_experts,
                        int(module.top_k))


def not_mapped_reason(module: torch.nn.Module) -> Optional[str]:
    """Why a sparse MoE block (a class named *SparseMoeBlock) is not mapped to MoE; None if it is or is no block."""
    if not type(module).__name__.endswith("SparseMoeBlock") or recognize(module) is not None:
        return None
    if hasattr(module, "shared_expert_gate"):
        return ("its shared expert's output is scaled by sigmoid(shared_expert_gate(x)); mindspore_hyper.moe.MoE's "
                "shared expert is not gated")
    return "its router, experts or activation are not Mixtral's (softmax, top-k renormalised, SiLU SwiGLU experts)"


def dense_experts_modules(root: torch.nn.Module, mapped: Dict[str, torch.nn.Module]) -> Dict[str, torch.nn.Module]:
    """Experts modules (gate_up_proj, down_proj; forward(hidden, top_k_index, top_k_weights)) outside mapped blocks."""
    found = {}
    for path, m in root.named_modules():
        if any(path == p or path.startswith(f"{p}.") for p in mapped):
            continue
        if type(m).__name__.endswith("Experts") and hasattr(m, "gate_up_proj") and hasattr(m, "down_proj") and \
                type(getattr(m, "act_fn", None)).__name__ in ("SiLUActivation", "SiLU"):
            found[path] = m
    return found


def dense_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                  top_k_weights: torch.Tensor) -> torch.Tensor:
    """An experts module's output with every expert run on every token, the non-chosen weighted 0."""
    num_experts = self.gate_up_proj.shape[0]
    chosen = (top_k_index[..., None] == torch.arange(num_experts)).to(hidden_states.dtype)  # [T, k, E]
    weights = (chosen * top_k_weights[..., None].to(hidden_states.dtype)).sum(1)  # [T, E]
    gate_up = torch.matmul(hidden_states.unsqueeze(0), self.gate_up_proj.transpose(1, 2))  # [E, T, 2F]
    g, u = gate_up.chunk(2, dim=-1)
    out = torch.matmul(self.act_fn(g) * u, self.down_proj.transpose(1, 2))  # [E, T, H]
    return (out * weights.transpose(0, 1)[:, :, None]).sum(0)


def dense_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """A Mixtral block's output with every expert computed and the non-chosen ones weighted 0."""
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    probs = torch.softmax(torch.nn.functional.linear(x, self.gate.weight).float(), dim=-1)
    top, index = torch.topk(probs, self.top_k, dim=-1)
    top = top / top.sum(dim=-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(1, index, top).to(x.dtype)  # [T, E]
    gate_up = torch.einsum("th,efh->tef", x, self.experts.gate_up_proj)
    g, u = gate_up.chunk(2, dim=-1)
    out = torch.einsum("tef,ehf->teh", torch.nn.functional.silu(g) * u, self.experts.down_proj)
    return (out * weights[:, :, None]).sum(1).reshape(shape)


@contextmanager
def dense_forwards(blocks: Dict[str, torch.nn.Module], experts: Dict[str, torch.nn.Module]) -> Iterator[None]:
    """Run each mapped block's `dense_forward` and each other experts module's `dense_experts` inside the body."""
    for block in blocks.values():
        block.forward = types.MethodType(dense_forward, block)
    for module in experts.values():
        module.forward = types.MethodType(dense_experts, module)
    try:
        yield
    finally:
        for module in list(blocks.values()) + list(experts.values()):
            del module.forward


def moe_weights(module: torch.nn.Module, path: str) -> Dict[str, Tuple[np.ndarray, str, str]]:
    """Cell parameter name -> (value, torch name, the layout change) of a mapped block at `path`."""
    f = module.experts.gate_up_proj.shape[1] // 2
    gate_up = module.experts.gate_up_proj.detach().numpy()
    down = module.experts.down_proj.detach().numpy()
    return {
        f"{path}.moe.router.weight": (module.gate.weight.detach().numpy().T.copy(), f"{path}.gate.weight",
                                      "transpose (E, H) -> (H, E)"),
        f"{path}.moe.experts.w_gate": (gate_up[:, :f, :].transpose(0, 2, 1).copy(), f"{path}.experts.gate_up_proj",
                                       "first half, transposed (E, F, H) -> (E, H, F)"),
        f"{path}.moe.experts.w_up": (gate_up[:, f:, :].transpose(0, 2, 1).copy(), f"{path}.experts.gate_up_proj",
                                     "second half, transposed (E, F, H) -> (E, H, F)"),
        f"{path}.moe.experts.w_down": (down.transpose(0, 2, 1).copy(), f"{path}.experts.down_proj",
                                       "transpose (E, H, F) -> (E, F, H)"),
    }


def moe_class_source(spec: MoEBlockSpec) -> str:
    """The generated class (named __CLASS__) of a mapped block."""
    return (
        "class __CLASS__(nn.Cell):\n"
        f'    """{spec.torch_type} as mindspore_hyper.moe.MoE: softmax router, top-k renormalised, SwiGLU experts\n'
        '    as batched weights (expert parallel under a strategy with an expert axis)."""\n\n'
        "    def __init__(self, hidden, ffn_hidden, num_experts, top_k):\n"
        "        super().__init__()\n"
        "        self.moe = MoE(hidden, ffn_hidden, num_experts, top_k=top_k, aux_loss_coef=0.0, normalize_top_k=True)\n\n"
        "    def construct(self, hidden_states):\n"
        "        output, _ = self.moe(hidden_states)  # the auxiliary loss: torch's block has none\n"
        "        return output")
