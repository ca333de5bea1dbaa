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

A sparse block whose semantics differ (gpt-oss's biased, clamped experts and its softmax over the
top-k logits) is converted generically: only its experts module
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

    def moe_options(self) -> Dict[str, object]:
        """MoE's keyword arguments beyond (hidden, ffn_hidden, num_experts, top_k) that differ from
        its defaults (the generated constructor call's)."""
        options = {"normalize_top_k": self.normalize, "shared_ffn_hidden": self.shared_ffn_hidden,
                   "shared_expert_gate": self.shared_gated}
        if self.scoring == "sigmoid":
            options.update(scoring="sigmoid", score_bias=True, group_score="top2_sum", num_groups=self.num_groups,
                           topk_groups=self.topk_groups, routed_scaling_factor=self.routed_scaling_factor)
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
        return _recognize_sigmoid(module)
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
    """A mapped block's output with every expert computed and the non-chosen ones weighted 0, its
    routing computed as mindspore_hyper.moe.MoE's router computes it."""
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    spec = recognize(self)
    weights = (_sigmoid_weights(self.gate, x, spec) if spec.scoring == "sigmoid" else _softmax_weights(self.gate, x, spec))
    weights = weights.to(x.dtype)  # [T, E]
    gate_up = torch.einsum("th,efh->tef", x, self.experts.gate_up_proj)
    g, u = gate_up.chunk(2, dim=-1)
    out = torch.einsum("tef,ehf->teh", torch.nn.functional.silu(g) * u, self.experts.down_proj)
    out = (out * weights[:, :, None]).sum(1)
    if spec.shared_gated:
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
    elif spec.shared_ffn_hidden:
        out = out + self.shared_experts(x)
    return out.reshape(shape)


def _softmax_weights(gate: torch.nn.Module, x: torch.Tensor, spec: MoEBlockSpec) -> torch.Tensor:
    probs = torch.softmax(torch.nn.functional.linear(x, gate.weight).float(), dim=-1)
    top, index = torch.topk(probs, spec.top_k, dim=-1)
    if spec.normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter(1, index, top)


def _sigmoid_weights(gate: torch.nn.Module, x: torch.Tensor, spec: MoEBlockSpec) -> torch.Tensor:
    """DeepSeek-V3's routing as MoE(scoring="sigmoid", score_bias=True, group_score="top2_sum")
    computes it (mindspore_hyper.moe.router): [T, E], the chosen experts' weights."""
    scores = torch.sigmoid(torch.nn.functional.linear(x.float(), gate.weight.float()))
    choice = scores + gate.e_score_correction_bias
    if spec.num_groups > 1:
        grouped = choice.reshape(choice.shape[0], spec.num_groups, -1)
        best = torch.topk(torch.topk(grouped, 2, dim=-1).values.sum(-1), spec.topk_groups, dim=-1).indices
        keep = torch.zeros_like(grouped[..., 0]).scatter(1, best, 1.0)
        choice = choice.masked_fill(keep.repeat_interleave(grouped.shape[-1], dim=1) == 0, float("-inf"))
    index = torch.topk(choice, spec.top_k, dim=-1).indices
    top = scores.gather(1, index)
    if spec.normalize and spec.top_k > 1:
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
    return torch.zeros_like(scores).scatter(1, index, top * spec.routed_scaling_factor)


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
        a, k, out = seen[path]
        out = out[0] if isinstance(out, tuple) else out
        try:
            with torch.no_grad():
                got = formulation(module)(module, *a, **k)
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
        module.forward = types.MethodType(_dense_of(module), module)
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


def moe_class_source(spec: MoEBlockSpec) -> str:
    """The generated class (named __CLASS__) of a mapped block; its constructor passes its keyword
    arguments (`MoEBlockSpec.moe_options`) to MoE."""
    routing = ("sigmoid router with score bias and top-2-sum groups, top-k scaled" if spec.scoring == "sigmoid"
               else "softmax router, top-k renormalised")
    return (
        "class __CLASS__(nn.Cell):\n"
        f'    """{spec.torch_type} as mindspore_hyper.moe.MoE: {routing}, SwiGLU experts\n'
        '    as batched weights (expert parallel under a strategy with an expert axis)."""\n\n'
        "    def __init__(self, hidden, ffn_hidden, num_experts, top_k, **options):\n"
        "        super().__init__()\n"
        "        self.moe = MoE(hidden, ffn_hidden, num_experts, top_k=top_k, aux_loss_coef=0.0, **options)\n\n"
        "    def construct(self, hidden_states):\n"
        "        output, _ = self.moe(hidden_states)  # the auxiliary loss: torch's block has none\n"
        "        return output")
