"""Sparse mixture-of-experts blocks of transformers models -> `mindspore_hyper.moe.MoE`.

A block is mapped when its semantics are MoE's exactly, with SwiGLU experts
(`silu(x Wg) * (x Wu)) Wd`, no expert bias) stored as `gate_up_proj` / `down_proj`:
- softmax routing: router logits `x W^T`, softmax over the experts (float32), the top-k
  probabilities (renormalised to sum to 1 where the block does: MoE's `normalize_top_k`), and no
  shared expert or a bias-free SiLU SwiGLU one scaled by sigmoid(shared_expert_gate(x)) (MoE's
  `shared_ffn_hidden` with `shared_expert_gate`): transformers' `MixtralSparseMoeBlock`,
  `Qwen3MoeSparseMoeBlock` and `OlmoeSparseMoeBlock` (their `norm_topk_prob`) and
  `Qwen2MoeSparseMoeBlock`;
- DeepSeek-V3's sigmoid routing: scores sigmoid(x W^T) in float32, the choice by the scores plus
  `e_score_correction_bias` within each token's `topk_group` best of `n_group` groups (a group
  ranked by the sum of its two best), the chosen scores renormalised (+1e-20) where
  `norm_topk_prob` and scaled by `routed_scaling_factor`, plus an ungated SiLU SwiGLU shared
  expert (MoE's `scoring="sigmoid"`, `score_bias`, `group_score="top2_sum"`,
  `routed_scaling_factor`): a block whose router has those attributes (`DeepseekV3MoE` and the
  families built on it).
The experts become MoE's batched weights (`w_gate`, `w_up`, `w_down`), so expert parallelism
applies. A recognised block is mapped only when its own forward equals the mapped formulation on
the conversion's example input (`verify_blocks`, <= 1e-5 relative): a family that shares the
attributes but computes something else stays generic, with the difference in the report.

torch.export cannot trace these blocks as written (their expert loop iterates over `nonzero()`),
so while exporting, a mapped block runs `dense_forward`: the same function computed for every
expert with the non-chosen gates zero (exact; traceable). Its traced ops are replaced by the MoE
Cell in the generated code.

- gpt-oss's MLP: router logits `x W^T + b`, the top-k logits weighted by their softmax, experts with
  biases and the clamped SwiGLU `(clip(u) + 1) * min(g, limit) * sigmoid(alpha min(g, limit))` over
  interleaved gate/up columns (MoE's `router_bias`, `scoring="topk_softmax"`, `expert_bias`,
  `activation="clamped_swiglu"`); the block returns (output, router scores), and so does its Cell.
A sparse block whose semantics differ is converted generically: only its experts module
(`...Experts(hidden, top_k_index, top_k_weights)`, the data-dependent loop) runs `dense_experts`
while exporting, so the generated code computes every expert for every token and weights the
non-chosen ones 0 (exact, E / k times the expert FLOPs); `not_mapped_reason` says why.
"""
from __future__ import annotations

import types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
import torch

__all__ = ["MoEBlockSpec", "recognize", "not_mapped_reason", "dense_experts_modules", "dense_forwards",
           "verify_dense", "verify_blocks", "moe_weights", "moe_class_source"]


@dataclass(frozen=True)
class MoEBlockSpec:
    """A torch MoE block that converts to `MoE(hidden, ffn_hidden, num_experts, top_k)`."""

    torch_type: str
    hidden: int
    ffn_hidden: int
    num_experts: int
    top_k: int
    normalize: bool = True  # the chosen probabilities renormalised to sum to 1 (Qwen3-MoE/OLMoE: norm_topk_prob)
    shared_ffn_hidden: int = 0  # the shared expert's feed-forward size; 0: none
    shared_gated: bool = False  # the shared expert scaled by sigmoid(shared_expert_gate(x)) (Qwen2-MoE)
    scoring: str = "softmax"  # "sigmoid": DeepSeek-V3's routing (score bias, top-2-sum groups, scaling factor)
    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    clamp: Optional[Tuple[float, float]] = None  # gpt-oss: biased experts with the clamped SwiGLU (alpha, limit)

    @property
    def returns_scores(self) -> bool:
        """The block returns (output, router scores) (gpt-oss's), not the output alone."""
        return self.scoring == "topk_softmax"

    def moe_options(self) -> Dict[str, object]:
        """MoE's keyword arguments beyond (hidden, ffn_hidden, num_experts, top_k) that differ from
        its defaults (the generated constructor call's)."""
        options = {"normalize_top_k": self.normalize, "shared_ffn_hidden": self.shared_ffn_hidden,
                   "shared_expert_gate": self.shared_gated}
        if self.scoring == "sigmoid":
            options.update(scoring="sigmoid", score_bias=True, group_score="top2_sum", num_groups=self.num_groups,
                           topk_groups=self.topk_groups, routed_scaling_factor=self.routed_scaling_factor)
        if self.scoring == "topk_softmax":
            options.update(scoring="topk_softmax", router_bias=True, expert_bias=True, activation="clamped_swiglu",
                           swiglu_alpha=self.clamp[0], swiglu_limit=self.clamp[1], normalize_top_k=True)
        defaults = {"normalize_top_k": True, "shared_ffn_hidden": 0, "shared_expert_gate": False,
                    "num_groups": 1, "topk_groups": 1, "routed_scaling_factor": 1.0}
        return {k: v for k, v in options.items() if defaults.get(k, None) != v}


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
        return _recognize_sigmoid(module) or _recognize_gpt_oss(module)
    if type(getattr(module, "gate", None)).__name__ not in _ROUTERS:
        return None
    experts = getattr(module, "experts", None)
    if experts is None or not _swiglu_experts(experts):
        return None
    if getattr(module, "jitter_noise", 0.0) and module.training:
        return None  # random router jitter in training: MoE has logit noise, not input jitter
    num_experts, two_f, hidden = experts.gate_up_proj.shape
    shared_ffn = _gated_shared_expert(module, hidden)
    if shared_ffn is None:
        return None
    flag = _SAME_ROUTING[kind]
    normalize = True if flag is None else bool(getattr(module.gate, flag))
    return MoEBlockSpec(f"{type(module).__module__}.{type(module).__qualname__}", hidden, two_f // 2, num_experts,
                        int(module.gate.top_k), normalize, shared_ffn, shared_gated=shared_ffn > 0)


_SIGMOID_ROUTER_ATTRIBUTES = ("weight", "e_score_correction_bias", "top_k", "norm_topk_prob", "routed_scaling_factor",
                              "topk_group")


def _recognize_sigmoid(module: torch.nn.Module) -> Optional[MoEBlockSpec]:
    """The spec of a DeepSeek-V3-style block (see module docstring), else None: a `gate` with the
    router attributes, Mixtral-layout bias-free SiLU experts, an ungated SwiGLU `shared_experts`."""
    gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
    if not isinstance(gate, torch.nn.Module) or not all(hasattr(gate, a) for a in _SIGMOID_ROUTER_ATTRIBUTES):
        return None
    groups = getattr(gate, "num_group", getattr(gate, "n_group", None))
    if not isinstance(groups, int) or experts is None or not _swiglu_experts(experts):
        return None
    num_experts, two_f, hidden = experts.gate_up_proj.shape
    if tuple(gate.weight.shape) != (num_experts, hidden) or tuple(gate.e_score_correction_bias.shape) != (num_experts,):
        return None
    if groups < 1 or num_experts % groups or not 1 <= gate.topk_group <= groups or (
            groups > 1 and num_experts // groups < 2):
        return None
    shared_ffn = _plain_shared_expert(getattr(module, "shared_experts", None), hidden)
    if shared_ffn is None or hasattr(module, "shared_expert_gate"):
        return None
    return MoEBlockSpec(f"{type(module).__module__}.{type(module).__qualname__}", hidden, two_f // 2, num_experts,
                        int(gate.top_k), bool(gate.norm_topk_prob), shared_ffn, scoring="sigmoid",
                        num_groups=groups, topk_groups=int(gate.topk_group),
                        routed_scaling_factor=float(gate.routed_scaling_factor))


def _recognize_gpt_oss(module: torch.nn.Module) -> Optional[MoEBlockSpec]:
    """The spec of a gpt-oss-style MLP (see module docstring), else None: a `router` with weight (E, H),
    bias (E,) and top_k, experts with gate_up_proj (E, H, 2F) and down_proj (E, F, H), their biases, the
    clamped SwiGLU's alpha and limit."""
    router, experts = getattr(module, "router", None), getattr(module, "experts", None)
    if not isinstance(router, torch.nn.Module) or not isinstance(experts, torch.nn.Module):
        return None
    weight, bias = getattr(router, "weight", None), getattr(router, "bias", None)
    names = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
    if not (isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor) and hasattr(router, "top_k")
            and all(isinstance(getattr(experts, n, None), torch.Tensor) for n in names)
            and hasattr(experts, "alpha") and hasattr(experts, "limit") and hasattr(experts, "_apply_gate")):
        return None
    num_experts, hidden, two_f = experts.gate_up_proj.shape
    if (tuple(weight.shape) != (num_experts, hidden) or tuple(bias.shape) != (num_experts,) or two_f % 2
            or tuple(experts.down_proj.shape) != (num_experts, two_f // 2, hidden)):
        return None
    if not float(experts.limit) > 0:
        return None
    return MoEBlockSpec(f"{type(module).__module__}.{type(module).__qualname__}", hidden, two_f // 2, num_experts,
                        int(router.top_k), scoring="topk_softmax",
                        clamp=(float(experts.alpha), float(experts.limit)))


def _swiglu_experts(experts: torch.nn.Module) -> bool:
    """Mixtral's experts layout: gate_up_proj (E, 2F, H) and down_proj (E, H, F), SiLU, no biases."""
    if not hasattr(experts, "gate_up_proj") or not hasattr(experts, "down_proj"):
        return False
    if type(getattr(experts, "act_fn", None)).__name__ not in ("SiLUActivation", "SiLU"):
        return False
    if getattr(experts, "has_bias", False) or getattr(experts, "gate_up_proj_bias", None) is not None:
        return False
    return experts.gate_up_proj.dim() == 3 and experts.down_proj.dim() == 3


def _plain_shared_expert(shared: Optional[torch.nn.Module], hidden: int) -> Optional[int]:
    """0 for none; the feed-forward size of a bias-free SiLU SwiGLU MLP (gate_proj, up_proj,
    down_proj); None for any other."""
    if shared is None:
        return 0
    linears = [getattr(shared, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(m, torch.nn.Linear) and m.bias is None for m in linears):
        return None
    if type(getattr(shared, "act_fn", None)).__name__ not in ("SiLUActivation", "SiLU"):
        return None
    if shared.gate_proj.in_features != hidden:
        return None
    return shared.gate_proj.out_features


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
        return ("its router has DeepSeek-V3's attributes (e_score_correction_bias, ...) but its experts, shared "
                "experts or group sizes are not the ones mindspore_hyper.moe.MoE maps (Mixtral-layout bias-free SiLU "
                "experts, an ungated bias-free SiLU SwiGLU shared expert, groups of >= 2 experts)")
    if getattr(experts, "gate_up_proj_bias", None) is not None:
        return ("its experts have biases but not gpt-oss's layout (gate_up_proj (E, H, 2F) with interleaved gate/up "
                "columns, down_proj (E, F, H), alpha and limit of the clamped SwiGLU) under a router with a bias, "
                "which is what mindspore_hyper.moe.MoE maps")
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
    """A mapped block's output with every expert computed and the non-chosen ones weighted 0, its
    routing computed as mindspore_hyper.moe.MoE's router computes it. On [..., H] as given (no
    flattening: a token count computed here would be a size the exported block takes from its caller)."""
    spec = recognize(self)
    x = hidden_states
    if spec.scoring == "topk_softmax":
        return _gpt_oss_forward(self, x.reshape(-1, x.shape[-1]), spec, x.shape)
    weights = (_sigmoid_weights(self.gate, x, spec) if spec.scoring == "sigmoid" else _softmax_weights(self.gate, x, spec))
    weights = weights.to(x.dtype)  # [..., E]
    gate_up = torch.einsum("...h,efh->...ef", x, self.experts.gate_up_proj)
    g, u = gate_up.chunk(2, dim=-1)
    out = torch.einsum("...ef,ehf->...eh", torch.nn.functional.silu(g) * u, self.experts.down_proj)
    out = (out * weights[..., None]).sum(-2)
    if spec.shared_gated:
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
    elif spec.shared_ffn_hidden:
        out = out + self.shared_experts(x)
    return out


def _gpt_oss_forward(self, x: torch.Tensor, spec: MoEBlockSpec, shape) -> Tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's MLP as MoE(router_bias, "topk_softmax", expert_bias, "clamped_swiglu") computes it:
    (output, the router scores [T, k])."""
    logits = torch.nn.functional.linear(x, self.router.weight, self.router.bias)
    top, index = torch.topk(logits, spec.top_k, dim=-1)
    scores = torch.softmax(top, dim=-1)
    weights = torch.zeros_like(logits).scatter(1, index, scores).to(x.dtype)  # [T, E]
    e = self.experts
    gate_up = torch.einsum("th,ehf->tef", x, e.gate_up_proj) + e.gate_up_proj_bias[None]
    g, u = gate_up[..., 0::2], gate_up[..., 1::2]
    alpha, limit = spec.clamp
    g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
    h = (u + 1) * (g * torch.sigmoid(g * alpha))
    out = torch.einsum("tef,efh->teh", h, e.down_proj) + e.down_proj_bias[None]
    return (out * weights[:, :, None]).sum(1).reshape(shape), scores


def _softmax_weights(gate: torch.nn.Module, x: torch.Tensor, spec: MoEBlockSpec) -> torch.Tensor:
    probs = torch.softmax(torch.nn.functional.linear(x, gate.weight).float(), dim=-1)
    top, index = torch.topk(probs, spec.top_k, dim=-1)
    if spec.normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter(-1, index, top)


def _sigmoid_weights(gate: torch.nn.Module, x: torch.Tensor, spec: MoEBlockSpec) -> torch.Tensor:
    """DeepSeek-V3's routing as MoE(scoring="sigmoid", score_bias=True, group_score="top2_sum")
    computes it (mindspore_hyper.moe.router): [..., E], the chosen experts' weights."""
    scores = torch.sigmoid(torch.nn.functional.linear(x.float(), gate.weight.float()))
    choice = scores + gate.e_score_correction_bias
    if spec.num_groups > 1:
        grouped = choice.unflatten(-1, (spec.num_groups, spec.num_experts // spec.num_groups))
        best = torch.topk(torch.topk(grouped, 2, dim=-1).values.sum(-1), spec.topk_groups, dim=-1).indices
        keep = torch.zeros_like(grouped[..., 0]).scatter(-1, best, 1.0)
        choice = choice.masked_fill(keep.repeat_interleave(grouped.shape[-1], dim=-1) == 0, float("-inf"))
    index = torch.topk(choice, spec.top_k, dim=-1).indices
    top = scores.gather(-1, index)
    if spec.normalize and spec.top_k > 1:
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
    return torch.zeros_like(scores).scatter(-1, index, top * spec.routed_scaling_factor)


def verify_blocks(root: torch.nn.Module, blocks: Dict[str, torch.nn.Module], args, kwargs) -> Dict[str, str]:
    """Run `root` once, and for every recognised block compare its own output with `dense_forward`
    on the input it received (<= 1e-5 relative): a block computing something else is not mapped.
    Returns path -> why, for those that differ."""
    return _verify(root, blocks, args, kwargs, lambda module: dense_forward)


def verify_dense(root: torch.nn.Module, experts: Dict[str, torch.nn.Module], args, kwargs) -> Dict[str, str]:
    """Run `root` once, and for every experts module compare its own output with its dense formulation on the
    inputs it received (<= 1e-5 relative): a class whose forward computes something else (a transposed layout,
    an extra term) must not be replaced. Returns path -> why, for those that differ (they are left as written)."""
    return _verify(root, experts, args, kwargs, _dense_of)


def _dense_of(module: torch.nn.Module):
    return dense_gated_experts if type(module).__name__ == "GptOssExperts" else dense_experts


def _verify(root: torch.nn.Module, modules: Dict[str, torch.nn.Module], args, kwargs, formulation) -> Dict[str, str]:
    """path -> why, for the `modules` whose own output on the input `root`'s run gave them differs from
    `formulation(module)(module, *inputs)` by more than 1e-5 relative (or which it cannot compute)."""
    seen: Dict[str, tuple] = {}
    hooks = []
    for path, module in modules.items():
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
    for path, module in modules.items():
        if path not in seen:
            continue
        a, k, full_out = seen[path]
        out = full_out[0] if isinstance(full_out, tuple) else full_out
        try:
            with torch.no_grad():
                got = formulation(module)(module, *a, **k)
            if isinstance(got, tuple):  # gpt-oss's (output, router scores): both compared
                error = max(_relative(g, o) for g, o in zip(got, full_out))
            else:
                error = _relative(got, out)
        except Exception as exc:  # noqa: BLE001 - another signature or layout
            refused[path] = f"its dense formulation does not apply ({type(exc).__name__}: {exc})"
            continue
        if not error <= 1e-5:
            refused[path] = f"its dense formulation differs from its forward ({error:.1e} relative)"
    return refused


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference relative to `want`'s largest magnitude (1 for an all-zero `want`); inf for another
    shape."""
    if tuple(got.shape) != tuple(want.shape):
        return float("inf")
    return float((got - want).abs().max()) / (float(want.abs().max()) or 1.0)


@contextmanager
def dense_forwards(blocks: Dict[str, torch.nn.Module], experts: Dict[str, torch.nn.Module]) -> Iterator[None]:
    """Run each mapped block's `dense_forward` and each other experts module's `dense_experts` inside the body."""
    for block in blocks.values():
        block.forward = types.MethodType(dense_forward, block)
    for module in experts.values():
        module.forward = types.MethodType(_dense_of(module), module)
    try:
        yield
    finally:
        for module in list(blocks.values()) + list(experts.values()):
            del module.forward


def moe_weights(module: torch.nn.Module, path: str) -> Dict[str, Tuple[np.ndarray, str, str]]:
    """Cell parameter name -> (value, torch name, the layout change) of a mapped block at `path`."""
    if recognize(module).scoring == "topk_softmax":
        return _gpt_oss_weights(module, path)
    f = module.experts.gate_up_proj.shape[1] // 2
    gate_up = module.experts.gate_up_proj.detach().numpy()
    down = module.experts.down_proj.detach().numpy()
    spec = recognize(module)
    shared = {}
    names = ((("shared_expert.gate_proj", "gate"), ("shared_expert.up_proj", "up"), ("shared_expert.down_proj", "down"),
              ("shared_expert_gate", "gate_score")) if spec.shared_gated else
             (("shared_experts.gate_proj", "gate"), ("shared_experts.up_proj", "up"),
              ("shared_experts.down_proj", "down")) if spec.shared_ffn_hidden else ())
    for torch_name, cell_name in names:
        value = module.get_submodule(torch_name).weight.detach().numpy().copy()
        shared[f"{path}.moe.shared.{cell_name}.weight"] = (value, f"{path}.{torch_name}.weight", "as is")
    if spec.scoring == "sigmoid":
        shared[f"{path}.moe.router.score_bias"] = (module.gate.e_score_correction_bias.detach().numpy().copy(),
                                                   f"{path}.gate.e_score_correction_bias", "as is")
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


def _gpt_oss_weights(module: torch.nn.Module, path: str) -> Dict[str, Tuple[np.ndarray, str, str]]:
    e, r = module.experts, module.router
    value = lambda t: t.detach().numpy()  # noqa: E731
    gate_up, gate_up_bias = value(e.gate_up_proj), value(e.gate_up_proj_bias)
    return {
        f"{path}.moe.router.weight": (value(r.weight).T.copy(), f"{path}.router.weight", "transpose (E, H) -> (H, E)"),
        f"{path}.moe.router.bias": (value(r.bias).copy(), f"{path}.router.bias", "as is"),
        f"{path}.moe.experts.w_gate": (gate_up[:, :, 0::2].copy(), f"{path}.experts.gate_up_proj",
                                       "even columns (E, H, 2F) -> (E, H, F)"),
        f"{path}.moe.experts.w_up": (gate_up[:, :, 1::2].copy(), f"{path}.experts.gate_up_proj",
                                     "odd columns (E, H, 2F) -> (E, H, F)"),
        f"{path}.moe.experts.b_gate": (gate_up_bias[:, 0::2].copy(), f"{path}.experts.gate_up_proj_bias",
                                       "even columns (E, 2F) -> (E, F)"),
        f"{path}.moe.experts.b_up": (gate_up_bias[:, 1::2].copy(), f"{path}.experts.gate_up_proj_bias",
                                     "odd columns (E, 2F) -> (E, F)"),
        f"{path}.moe.experts.w_down": (value(e.down_proj).copy(), f"{path}.experts.down_proj", "as is"),
        f"{path}.moe.experts.b_down": (value(e.down_proj_bias).copy(), f"{path}.experts.down_proj_bias", "as is"),
    }


def moe_class_source(spec: MoEBlockSpec, scores: Optional[str] = None) -> str:
    """The generated class (named __CLASS__) of a mapped block; its constructor passes its keyword
    arguments (`MoEBlockSpec.moe_options`) to MoE. A block whose callers use its router scores (gpt-oss's
    second output: the softmax of each token's top-k logits) returns them too, `scores` "first" or "last" as
    the exported block returns them; None: the output alone."""
    routing = {"sigmoid": "sigmoid router with score bias and top-2-sum groups, top-k scaled",
               "topk_softmax": "biased router, softmax over the top-k logits, biased clamped-SwiGLU experts"}.get(
        spec.scoring, "softmax router, top-k renormalised")
    body = ("    def construct(self, hidden_states):\n"
            "        output, _ = self.moe(hidden_states)  # the auxiliary loss: torch's block has none\n")
    if scores is None:
        body += "        return output"
    else:
        body += ("        router = self.moe.router\n"
                 "        logits = ops.matmul(hidden_states.reshape(-1, hidden_states.shape[-1]), router.weight) + router.bias\n"
                 "        top, _ = ops.topk(logits, router.top_k)\n"
                 + ("        return ops.softmax(top, -1), output  # the block's router scores [T, k], its output"
                    if scores == "first" else
                    "        return output, ops.softmax(top, -1)  # the block's output, its router scores [T, k]"))
    return (
        "class __CLASS__(nn.Cell):\n"
        f'    """{spec.torch_type} as mindspore_hyper.moe.MoE: {routing}, SwiGLU experts\n'
        '    as batched weights (expert parallel under a strategy with an expert axis)."""\n\n'
        "    def __init__(self, hidden, ffn_hidden, num_experts, top_k, **options):\n"
        "        super().__init__()\n"
        "        self.moe = MoE(hidden, ffn_hidden, num_experts, top_k=top_k, aux_loss_coef=0.0, **options)\n\n"
        + body)
