"""Sparse mixture-of-experts blocks of transformers models -> `mindspore_hyper.moe.MoE`.

A block is mapped when its semantics are MoE's exactly: router logits `x W^T`, softmax over the
experts (float32), the top-k probabilities (renormalised to sum to 1 where the block does: MoE's
`normalize_top_k`), SwiGLU experts (`silu(x Wg) * (x Wu)) Wd`, no expert bias) and no shared expert,
or a bias-free SiLU SwiGLU one scaled by sigmoid(shared_expert_gate(x)) (MoE's `shared_ffn_hidden`
with `shared_expert_gate`): transformers' `MixtralSparseMoeBlock`, `Qwen3MoeSparseMoeBlock` and
`OlmoeSparseMoeBlock` (their `norm_topk_prob`) and `Qwen2MoeSparseMoeBlock`. `MixtralSparseMoeBlock`
(`MixtralTopKRouter` + `MixtralExperts`, SiLU, no router jitter) is such a block; the experts
become MoE's batched weights (`w_gate`, `w_up`, `w_down`), so expert parallelism applies.

torch.export cannot trace these blocks as written (their expert loop iterates over `nonzero()`),
so while exporting, a mapped block runs `dense_forward`: the same function computed for every
expert with the non-chosen gates zero (exact; traceable). Its traced ops are replaced by the MoE
Cell in the generated code.

A sparse block whose semantics differ (DeepSeek-V3's routing, gpt-oss's experts) is converted generically: only
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
           "verify_dense", "moe_weights", "moe_class_source"]


@dataclass(frozen=True)
class MoEBlockSpec:
    """A torch MoE block that converts to `MoE(hidden, ffn_hidden, num_experts, top_k)`."""

    torch_type: str
    hidden: int
    ffn_hidden: int
    num_experts: int
    top_k: int
    normalize: bool = True  # the chosen probabilities renormalised to sum to 1 (Qwen3-MoE/OLMoE: norm_topk_prob)
    shared_ffn_hidden: int = 0  # the gated shared expert's feed-forward size (Qwen2-MoE); 0: none


# blocks whose router is softmax(x W^T) in float32 -> top-k -> (renormalised when the flag says so), whose
# experts are SwiGLU over gate_up_proj / down_proj, and whose output is the weighted sum alone (read in their
# transformers 5 sources): block class -> the attribute holding the renormalisation flag (None: always)
_SAME_ROUTING = {"MixtralSparseMoeBlock": None, "Qwen3MoeSparseMoeBlock": "norm_topk_prob",
                 "OlmoeSparseMoeBlock": "norm_topk_prob", "Qwen2MoeSparseMoeBlock": "norm_topk_prob"}
_ROUTERS = {"MixtralTopKRouter", "Qwen3MoeTopKRouter", "OlmoeTopKRouter", "Qwen2MoeTopKRouter"}


def recognize(module: torch.nn.Module) -> Optional[MoEBlockSpec]:
    """The spec of a block with MoE's semantics (see module docstring), else None."""
    kind = type(module).__name__
    if kind not in _SAME_ROUTING:
        return None
    if type(getattr(module, "gate", None)).__name__ not in _ROUTERS:
        return None
    gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
    if gate is None or experts is None or not hasattr(experts, "gate_up_proj") or not hasattr(experts, "down_proj"):
        return None
    if type(getattr(experts, "act_fn", None)).__name__ not in ("SiLUActivation", "SiLU"):
        return None
    if getattr(module, "jitter_noise", 0.0) and module.training:
        return None  # random router jitter in training: MoE has logit noise, not input jitter
    if getattr(experts, "has_bias", False) or getattr(experts, "gate_up_proj_bias", None) is not None:
        return None
    num_experts, two_f, hidden = experts.gate_up_proj.shape
    shared_ffn = _gated_shared_expert(module, hidden)
    if shared_ffn is None:
        return None
    flag = _SAME_ROUTING[kind]
    normalize = True if flag is None else bool(getattr(module.gate, flag))
    return MoEBlockSpec(f"{type(module).__module__}.{type(module).__qualname__}", hidden, two_f // 2, num_experts,
                        int(module.gate.top_k), normalize, shared_ffn)


def _gated_shared_expert(module: torch.nn.Module, hidden: int) -> Optional[int]:
    """0 for a block without a shared expert; the feed-forward size of a shared expert MoE's gated one
    computes (bias-free gate/up/down Linears, SiLU, a bias-free Linear(H, 1) `shared_expert_gate`); None for
    any other."""
    shared, gate = getattr(module, "shared_expert", None), getattr(module, "shared_expert_gate", None)
    if shared is None and gate is None:
        return 0
    linears = [getattr(shared, n, None) for n in ("gate_proj", "up_proj", "down_proj")] + [gate]
    if not all(isinstance(m, torch.nn.Linear) and m.bias is None for m in linears):
        return None
    if type(getattr(shared, "act_fn", None)).__name__ not in ("SiLUActivation", "SiLU"):
        return None
    if (gate.in_features, gate.out_features) != (hidden, 1) or shared.gate_proj.in_features != hidden:
        return None
    return shared.gate_proj.out_features


def not_mapped_reason(module: torch.nn.Module) -> Optional[str]:
    """Why a sparse MoE block (a class named *SparseMoeBlock, or a module with an experts child holding
    gate_up_proj and a gate/router child) is not mapped to MoE; None if it is, or is no block."""
    experts = getattr(module, "experts", None)
    router = getattr(module, "gate", None) or getattr(module, "router", None)
    block = type(module).__name__.endswith("SparseMoeBlock") or (
        isinstance(router, torch.nn.Module) and hasattr(experts, "gate_up_proj"))
    if not block or recognize(module) is not None:
        return None
    if hasattr(module, "shared_expert_gate") or hasattr(module, "shared_expert"):
        return ("its shared expert is not a bias-free SiLU SwiGLU scaled by a bias-free Linear(H, 1) gate, which is "
                "the shared expert mindspore_hyper.moe.MoE has")
    if hasattr(router, "e_score_correction_bias"):
        return ("its router scores experts by sigmoid (not softmax), chooses by the scores plus "
                "e_score_correction_bias within the groups of highest top-2 score sum, and scales the chosen scores "
                "by routed_scaling_factor; mindspore_hyper.moe.MoE's router takes a softmax, ranks groups by their "
                "best probability and has neither the bias nor the scale")
    if getattr(experts, "gate_up_proj_bias", None) is not None:
        return ("its experts have biases and a clamped SwiGLU ((up + 1) * gate * sigmoid(alpha * gate)), and its "
                "router takes the softmax of the top-k logits; mindspore_hyper.moe.MoE's experts are bias-free SiLU "
                "SwiGLU routed by a softmax over all experts")
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
        elif type(m).__name__ == "GptOssExperts" and hasattr(m, "_apply_gate"):
            found[path] = m  # biased experts, clamped SwiGLU: dense_gated_experts
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


def dense_gated_experts(self, hidden_states: torch.Tensor, router_indices: torch.Tensor,
                        routing_weights: torch.Tensor) -> torch.Tensor:
    """gpt-oss's experts (gate_up_proj (E, H, 2F) and down_proj (E, F, H) with biases, its own clamped SwiGLU
    `_apply_gate`) run on every token, the non-chosen weighted 0 (exact, E / k times the expert FLOPs)."""
    num_experts = self.gate_up_proj.shape[0]
    chosen = (router_indices[..., None] == torch.arange(num_experts)).to(hidden_states.dtype)  # [T, k, E]
    weights = (chosen * routing_weights[..., None].to(hidden_states.dtype)).sum(1)  # [T, E]
    gate_up = torch.matmul(hidden_states.unsqueeze(0), self.gate_up_proj) + self.gate_up_proj_bias[:, None, :]
    out = torch.matmul(self._apply_gate(gate_up), self.down_proj) + self.down_proj_bias[:, None, :]  # [E, T, H]
    return (out * weights.transpose(0, 1)[:, :, None]).sum(0)


def dense_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """A Mixtral block's output with every expert computed and the non-chosen ones weighted 0."""
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    probs = torch.softmax(torch.nn.functional.linear(x, self.gate.weight).float(), dim=-1)
    spec = recognize(self)
    top, index = torch.topk(probs, spec.top_k, dim=-1)
    if spec.normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(1, index, top).to(x.dtype)  # [T, E]
    gate_up = torch.einsum("th,efh->tef", x, self.experts.gate_up_proj)
    g, u = gate_up.chunk(2, dim=-1)
    out = torch.einsum("tef,ehf->teh", torch.nn.functional.silu(g) * u, self.experts.down_proj)
    out = (out * weights[:, :, None]).sum(1)
    if spec.shared_ffn_hidden:
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
    return out.reshape(shape)


def verify_dense(root: torch.nn.Module, experts: Dict[str, torch.nn.Module], args, kwargs) -> Dict[str, str]:
    """Run `root` once, and for every experts module compare its own output with its dense formulation on the
    inputs it received (<= 1e-5 relative): a class whose forward computes something else (a transposed layout,
    an extra term) must not be replaced. Returns path -> why, for those that differ (they are left as written)."""
    seen: Dict[str, tuple] = {}
    hooks = []
    for path, module in experts.items():
        def hook(mod, a, k, out, path=path):
            seen.setdefault(path, (a, k, out))
        hooks.append(module.register_forward_hook(hook, with_kwargs=True))
    from mindspore_hyper.migrate.lowering import preserved_buffers

    try:
        with torch.no_grad(), preserved_buffers(root):
            root(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    refused = {}
    for path, module in experts.items():
        if path not in seen:
            continue
        a, k, out = seen[path]
        dense = dense_gated_experts if type(module).__name__ == "GptOssExperts" else dense_experts
        try:
            with torch.no_grad():
                got = dense(module, *a, **k)
            scale = float(out.abs().max()) or 1.0
            error = float((got - out).abs().max()) / scale
        except Exception as exc:  # noqa: BLE001 - another signature or layout
            refused[path] = f"its dense formulation does not apply ({type(exc).__name__}: {exc})"
            continue
        if not error <= 1e-5:
            refused[path] = f"its dense formulation differs from its forward ({error:.1e} relative)"
    return refused


@contextmanager
def dense_forwards(blocks: Dict[str, torch.nn.Module], experts: Dict[str, torch.nn.Module]) -> Iterator[None]:
    """Run each mapped block's `dense_forward` and each other experts module's `dense_experts` inside the body."""
    for block in blocks.values():
        block.forward = types.MethodType(dense_forward, block)
    for module in experts.values():
        dense = dense_gated_experts if type(module).__name__ == "GptOssExperts" else dense_experts
        module.forward = types.MethodType(dense, module)
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
    shared = {}
    if getattr(module, "shared_expert_gate", None) is not None:
        for torch_name, cell_name in (("shared_expert.gate_proj", "gate"), ("shared_expert.up_proj", "up"),
                                      ("shared_expert.down_proj", "down"), ("shared_expert_gate", "gate_score")):
            value = module.get_submodule(torch_name).weight.detach().numpy().copy()
            shared[f"{path}.moe.shared.{cell_name}.weight"] = (value, f"{path}.{torch_name}.weight", "as is")
    return {**shared,
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
        "    def __init__(self, hidden, ffn_hidden, num_experts, top_k, normalize_top_k=True, shared_ffn_hidden=0):\n"
        "        super().__init__()\n"
        "        self.moe = MoE(hidden, ffn_hidden, num_experts, top_k=top_k, aux_loss_coef=0.0,\n"
        "                       normalize_top_k=normalize_top_k, shared_ffn_hidden=shared_ffn_hidden,\n"
        "                       shared_expert_gate=shared_ffn_hidden > 0)\n\n"
        "    def construct(self, hidden_states):\n"
        "        output, _ = self.moe(hidden_states)  # the auxiliary loss: torch's block has none\n"
        "        return output")
