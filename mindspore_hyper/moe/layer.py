"""`MoE`: a mixture-of-experts layer as one nn.Cell.

``y, aux = moe(x)``: x [..., H] -> y [..., H] (routed experts, plus the shared expert if any) and
the router's auxiliary loss (load balancing + z-loss, `mindspore_hyper.moe.losses`), which the
caller adds to its loss. On one device it runs the experts directly; inside a parallel model
(its input a DTensor) it runs expert parallel (`mindspore_hyper.moe.expert_parallel`) with the
expert mesh axis its batched expert weights are split over in the strategy.
"""
from __future__ import annotations

from typing import Hashable, Optional, Tuple

import numpy as np
from mindspore import Tensor, nn

from mindspore_hyper.dtensor import DTensor
from mindspore_hyper.moe.token_dispatch import expert_capacity, plan_dispatch
from mindspore_hyper.moe.experts import GroupedExperts, SharedExpert, combine_copies, run_experts
from mindspore_hyper.moe.losses import load_balancing_loss, logsumexp_square_sum
from mindspore_hyper.moe.router import TopKRouter

__all__ = ["MoE"]


class MoE(nn.Cell):
    """A mixture-of-experts feed-forward layer (see module docstring).

    Args:
        hidden: H.
        ffn_hidden: feed-forward size F of each routed expert.
        num_experts: E routed experts.
        top_k: experts per token.
        capacity_factor: copies per expert = ceil(factor * T * k / E), extra copies dropped
            (GShard/Switch); None: dropless. Under expert parallelism T is a device's tokens
            (GShard's per-group capacity).
        aux_loss_coef: load-balancing loss coefficient (Switch/GShard; 0 disables).
        z_loss_coef: router z-loss coefficient (ST-MoE; 0 disables).
        shared_ffn_hidden: feed-forward size of a DeepSeek-V3 shared expert (0: none).
        shared_expert_gate: scale the shared expert's output per token by sigmoid(x . w), w a
            learned [H] vector (Qwen2-MoE's `shared_expert_gate`); needs a shared expert.
        normalize_top_k: renormalise the chosen gates to sum to 1.
        noise_std: router logit noise in training (0: none).
        routing_bits: under msrun, send the routing as a 1-bit token x expert mask instead of
            per-expert counts (`mindspore_hyper.moe.routing_bits`).
        num_groups: expert groups for group-limited routing (1: none).
        topk_groups: groups each token may use (DeepSeek-V3: 4 of 8).
        scoring: the router's scores, "softmax" over the experts or "sigmoid" per expert
            (DeepSeek-V3; `mindspore_hyper.moe.router`).
        score_bias: the router holds DeepSeek-V3's score correction bias (`router.score_bias`,
            [E], not trained by gradients), added to the scores for the choice only.
        group_score: how group-limited routing ranks a group: "max" or "top2_sum" (DeepSeek-V3).
        routed_scaling_factor: the routed experts' weights' factor (DeepSeek-V3's), > 0.
        router_bias: the router adds a learned bias to its logits (gpt-oss).
        expert_bias: the routed experts hold biases (gpt-oss; `mindspore_hyper.moe.experts`).
        activation: the routed experts' "swiglu" or gpt-oss's "clamped_swiglu".
        swiglu_alpha: the clamped SwiGLU's sigmoid slope (gpt-oss: 1.702).
        swiglu_limit: the clamped SwiGLU's bound (gpt-oss: 7.0).
        overlap_chunks: under expert parallelism, pipeline each device's tokens in this many
            chunks (dispatch / compute / combine; background AllToAll under msrun). 1: none.
        dispatch: under expert parallelism, "flat" (one uneven AllToAll over the expert axes) or
            "hierarchical" (a token's row goes once to each destination group, then inside it to
            its experts' devices; `mindspore_hyper.moe.hierarchical`).
        expert_groups: the groups G of the expert-parallel devices (contiguous, equal size) for
            the hierarchical dispatch and the bytes per link level; None: the topology's nodes.

    Raises:
        ValueError: sizes or options out of range (named in the message).
    """

    def __init__(self, hidden: int, ffn_hidden: int, num_experts: int, top_k: int = 2,
                 capacity_factor: Optional[float] = None, aux_loss_coef: float = 0.01, z_loss_coef: float = 0.0,
                 shared_ffn_hidden: int = 0, normalize_top_k: bool = True, noise_std: float = 0.0,
                 routing_bits: bool = False, overlap_chunks: int = 1, num_groups: int = 1, topk_groups: int = 1,
                 dispatch: str = "flat", expert_groups: Optional[int] = None, shared_expert_gate: bool = False,
                 scoring: str = "softmax", score_bias: bool = False, group_score: str = "max",
                 routed_scaling_factor: float = 1.0, router_bias: bool = False, expert_bias: bool = False,
                 activation: str = "swiglu", swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0):
        super().__init__()
        if dispatch not in ("flat", "hierarchical"):
            raise ValueError(f"MoE: dispatch={dispatch!r}; expected 'flat' or 'hierarchical'")
        if expert_groups is not None and (isinstance(expert_groups, bool) or not isinstance(expert_groups, int)
                                          or expert_groups < 1):
            raise ValueError(f"MoE: expert_groups={expert_groups!r} must be a positive integer (or None: the "
                             f"topology's nodes)")
        self.dispatch, self.expert_groups = dispatch, expert_groups
        expert_capacity(1, num_experts, 1, capacity_factor)  # validates the factor
        if aux_loss_coef < 0 or z_loss_coef < 0:
            raise ValueError(f"MoE: aux_loss_coef={aux_loss_coef} and z_loss_coef={z_loss_coef} must be >= 0")
        if shared_ffn_hidden < 0:
            raise ValueError(f"MoE: shared_ffn_hidden={shared_ffn_hidden} must be >= 0")
        if not isinstance(shared_expert_gate, bool) or (shared_expert_gate and not shared_ffn_hidden):
            raise ValueError(f"MoE: shared_expert_gate={shared_expert_gate!r} must be a bool, True only with a shared "
                             f"expert (shared_ffn_hidden > 0, here {shared_ffn_hidden})")
        self.hidden, self.num_experts, self.top_k = hidden, num_experts, top_k
        self.capacity_factor = capacity_factor
        self.aux_loss_coef, self.z_loss_coef = float(aux_loss_coef), float(z_loss_coef)
        self.routing_bits = bool(routing_bits)
        if not isinstance(overlap_chunks, int) or overlap_chunks < 1:
            raise ValueError(f"MoE: overlap_chunks={overlap_chunks!r} must be an integer >= 1")
        self.overlap_chunks = overlap_chunks
        self.router = TopKRouter(hidden, num_experts, top_k, normalize_top_k, noise_std, num_groups=num_groups,
                                 topk_groups=topk_groups, scoring=scoring, score_bias=score_bias,
                                 group_score=group_score, routed_scaling_factor=routed_scaling_factor,
                                 bias=router_bias)
        self.experts = GroupedExperts(num_experts, hidden, ffn_hidden, expert_bias, activation, swiglu_alpha,
                                      swiglu_limit)
        self.shared = SharedExpert(hidden, shared_ffn_hidden, shared_expert_gate) if shared_ffn_hidden else None
        self.last_expert_counts: Optional[np.ndarray] = None  # [E] copies per expert of the last call
        self._parallel = None  # the ExpertParallel engine, made on the first parallel call
        self.expert_offload = None  # offload.expert_offload.ExpertOffload when hyper_offload keeps the experts

    def aux_loss(self, prob_sums: Tensor, choice_counts: Tensor, logit_sq_sum: Tensor, num_tokens: int) -> Tensor:
        """Load-balancing + z-loss from sums over the batch's `num_tokens` tokens."""
        aux = load_balancing_loss(prob_sums, choice_counts, num_tokens, self.top_k, self.aux_loss_coef)
        if self.z_loss_coef:
            aux = aux + self.z_loss_coef * logit_sq_sum / float(num_tokens)
        return aux

    def construct(self, x: Tensor, microbatch: Hashable = 0) -> Tuple[Tensor, Tensor]:
        """(y, aux loss) of x [..., H]; `microbatch` keys the dispatch state under expert
        parallelism (ignored on one device)."""
        if x.shape[-1] != self.hidden:
            raise ValueError(f"MoE: input's last dimension is {x.shape[-1]}, expected hidden={self.hidden}")
        if isinstance(x, DTensor):
            if self.expert_offload is not None:
                raise NotImplementedError("MoE: an offloaded layer's experts (hyper_offload's expert cache) run on "
                                          "one device only, not expert parallel")
            routed, aux = self.parallel().forward(x, microbatch)
        else:
            routed, aux = self._local(x)
        if self.shared is not None:
            routed = routed + self.shared(x)
        return routed, aux

    def parallel(self):
        """The expert-parallel engine of this layer (its dispatch states are per microbatch)."""
        if self._parallel is None:
            from mindspore_hyper.moe.expert_parallel import ExpertParallel

            self._parallel = ExpertParallel(self)
        return self._parallel

    def _local(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """All experts on this device: the single-device reference."""
        tokens = x.reshape(-1, self.hidden)
        num_tokens = tokens.shape[0]
        routing = self.router(tokens)
        plan = plan_dispatch(routing.experts, self.num_experts,
                             expert_capacity(num_tokens, self.num_experts, self.top_k, self.capacity_factor))
        self.last_expert_counts = plan.choice_counts
        e = self.experts
        if self.expert_offload is None:
            outs = run_experts(tokens, plan, e.w_gate, e.w_up, e.w_down, biases=e.biases(), clamp=e.clamp)
        else:  # the weights hold the routed experts only (offload/expert_offload.py)
            used = self.expert_offload.bring(plan.counts)
            outs = [None] * self.num_experts
            for e_id, out in zip(used, run_experts(tokens, plan, e.w_gate, e.w_up, e.w_down, experts=used)):
                outs[e_id] = out
        y = combine_copies(plan, outs, routing.gates, self.hidden, tokens.dtype)
        aux = self.aux_loss(routing.probs.sum(0), Tensor(plan.choice_counts.astype(np.float32)),
                            logsumexp_square_sum(routing.logits), num_tokens)
        return y.reshape(x.shape), aux
