"""Top-k router: which experts each token goes to, and with what weight.

The router is a linear map from the hidden state to one logit per expert. With softmax scoring
(Mixtral, Qwen-MoE, DeepSeek-V2) a token's scores are the softmax over experts; with sigmoid
scoring (DeepSeek-V3) each expert's score is sigmoid(logit) on its own. A token goes to its
`top_k` best experts, and its output is the sum of those experts' outputs weighted by their
scores (renormalised over the chosen k when `normalize_top_k`; times `routed_scaling_factor`,
DeepSeek-V3's). DeepSeek-V3's score correction bias (`score_bias`, a per-expert vector
that is not trained by gradients) is added to the scores for the choice only, not to the weights.
Optional Gaussian noise on the logits during training (noisy top-k gating, Shazeer et al. 2017,
with a fixed standard deviation) spreads the choice while the router is still undecided.
With "topk_softmax" scoring (gpt-oss) a token goes to its `top_k` largest logits and their
weights are the softmax over those k logits alone. A router may add a learned bias to its logits
(`bias`, gpt-oss). Group-limited routing (DeepSeek-V2/V3) confines a token to its best few expert groups, a group
scored by its best score (V2: `group_score="max"`) or the sum of its two best (V3: "top2_sum");
with expert groups placed on groups of devices (nodes), each token's copies then cross fewer slow
links (`mindspore_hyper.moe.groups`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer

from mindspore_hyper.context import get_context
from mindspore_hyper.dtensor.meta import MetaTensor

__all__ = ["TopKRouter", "Routing", "route_tokens", "limit_groups", "balanced_choice", "histogram_choice",
           "routing_assumption"]


@dataclass
class Routing:
    """The router's decision for T tokens over E experts.

    Attributes:
        logits: [T, E] router logits (differentiable).
        probs: [T, E] each token's distribution over experts, what the load-balancing loss
            averages (differentiable): the softmax of the logits (for "topk_softmax" too), or with
            sigmoid scoring the scores normalised to sum to 1 per token (DeepSeek-V3's balance
            loss takes them so).
        gates: [T, k] weights of the chosen experts (differentiable).
        experts: [T, k] int64 numpy array of the chosen expert ids, best first.
    """

    logits: Tensor
    probs: Tensor
    gates: Tensor
    experts: np.ndarray


SCORINGS = ("softmax", "sigmoid", "topk_softmax")
GROUP_SCORES = ("max", "top2_sum")


def limit_groups(choice: np.ndarray, num_groups: int, topk_groups: int, group_score: str = "max") -> np.ndarray:
    """Group-limited routing (DeepSeek-V2/V3): experts split into `num_groups` contiguous groups;
    a token may only choose experts in its `topk_groups` groups of highest score (the group's
    best choice score, or with "top2_sum" the sum of its two best). Returns `choice` with the
    other groups' entries set to -inf."""
    tokens, experts = choice.shape
    grouped = choice.reshape(tokens, num_groups, experts // num_groups)
    if group_score == "top2_sum":
        score = -np.sort(-grouped, axis=-1)[..., :2].sum(-1)
    else:
        score = grouped.max(-1)
    best = np.argsort(-score, axis=-1, kind="stable")[:, :topk_groups]
    keep = np.zeros((tokens, num_groups), dtype=bool)
    keep[np.arange(tokens)[:, None], best] = True
    return np.where(np.repeat(keep, experts // num_groups, axis=1), choice, -np.inf)


def balanced_choice(tokens: int, experts: int, top_k: int) -> np.ndarray:
    """The dry run's routing assumption (it has no logits to rank): token t's j-th choice is
    expert (t * top_k + j) mod E, so every expert receives the same number of token copies
    (within one when T * k is not a multiple of E) and a token's k experts are distinct."""
    return ((np.arange(tokens)[:, None] * top_k + np.arange(top_k)[None, :]) % experts).astype(np.int64)


def histogram_choice(tokens: int, fractions, top_k: int) -> np.ndarray:
    """A given routing histogram (`set_context(moe_routing=[f_0, ..., f_{E-1}])`): of the T * k
    token copies, expert e receives n_e = f_e * T * k rounded by largest remainder (ties to the
    lower expert; the n_e sum to T * k). Experts are laid out in order, n_e slots each, over the
    copies j * T + t (token t's j-th choice), so a token's k experts are distinct.

    Args:
        tokens: T, the tokens this device routes.
        fractions: one fraction per expert (>= 0, summing to 1, as the context flag checks).
        top_k: k.

    Returns:
        [T, k] int64 expert ids.

    Raises:
        ValueError: an expert's share above 1/k (more copies than tokens: a token cannot choose
            one expert twice), naming `moe_routing`.
    """
    copies = tokens * top_k
    exact = np.asarray(fractions, np.float64) * copies
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")  # largest remainders first, lower expert on ties
    counts[order[:copies - int(counts.sum())]] += 1
    if counts.max() > tokens:
        e = int(counts.argmax())
        raise ValueError(f"moe_routing: expert {e}'s fraction {fractions[e]:g} gives {int(counts[e])} of the "
                         f"{copies} token copies of {tokens} tokens; a token's top_k={top_k} experts are distinct, "
                         f"so no fraction may exceed 1/top_k = {1 / top_k:g}")
    return np.repeat(np.arange(len(counts)), counts).reshape(top_k, tokens).T.astype(np.int64)


def routing_assumption(num_experts: int):
    """The routing the context asks of a router over `num_experts` experts when it does not rank
    logits: the histogram's fractions, "balanced", or None (learned).

    Raises:
        ValueError: a histogram whose length is not `num_experts`, naming `moe_routing`.
    """
    routing = get_context("moe_routing")
    if isinstance(routing, tuple):
        if len(routing) != num_experts:
            raise ValueError(f"moe_routing: a histogram of {len(routing)} fractions for a MoE layer of "
                             f"{num_experts} experts; expected one fraction per expert")
        return routing
    return None if routing == "learned" else routing


def route_tokens(tokens: Tensor, weight: Tensor, top_k: int, normalize_top_k: bool = True,
                 noise: Tensor = None, num_groups: int = 1, topk_groups: int = 1, scoring: str = "softmax",
                 score_bias: Tensor = None, group_score: str = "max", routed_scaling_factor: float = 1.0,
                 logit_bias: Tensor = None) -> Routing:
    """Route `tokens` [T, H] with router `weight` [H, E] and `logit_bias` [E] (or None) (see
    module docstring); `noise` [T, E] is added to the logits used for the choice (not to the
    weights), and `score_bias` [E] to the scores used for the choice (read only there: a dry run
    never reads it); with `num_groups` > 1 the choice is limited to each token's `topk_groups`
    best expert groups (`limit_groups`)."""
    logits = ops.matmul(tokens, weight)
    if logit_bias is not None:
        logits = logits + logit_bias
    logits32 = logits.astype(ms.float32)
    scores = _scores(logits32, scoring)
    probs = scores / scores.sum(-1, keepdims=True) if scoring == "sigmoid" else scores
    assumed = routing_assumption(probs.shape[1])
    if assumed is not None or isinstance(probs, MetaTensor):  # a dry run has no logits: balanced by default
        experts = (histogram_choice(probs.shape[0], assumed, top_k) if isinstance(assumed, tuple)
                   else balanced_choice(probs.shape[0], probs.shape[1], top_k))
        return Routing(logits, probs, _gates(logits32, scores, experts, scoring), experts)
    ranked = logits32 if scoring == "topk_softmax" else scores
    choice = (ranked if noise is None else
              (logits32 + noise if scoring == "topk_softmax" else _scores(logits32 + noise, scoring))).asnumpy()
    if score_bias is not None:
        choice = choice + score_bias.asnumpy()
    if num_groups > 1:
        choice = limit_groups(choice, num_groups, topk_groups, group_score)
    experts = np.argsort(-choice, axis=-1, kind="stable")[:, :top_k].astype(np.int64)
    gates = _gates(logits32, scores, experts, scoring)
    if normalize_top_k and top_k > 1 and scoring != "topk_softmax":  # topk_softmax's gates sum to 1 already
        # sigmoid scores need not sum to anything: DeepSeek-V3 guards the division by 1e-20
        gates = gates / (gates.sum(-1, keepdims=True) + (1e-20 if scoring == "sigmoid" else 0.0))
    if routed_scaling_factor != 1.0:
        gates = gates * routed_scaling_factor
    return Routing(logits, probs, gates, experts)


def _scores(logits: Tensor, scoring: str) -> Tensor:
    return ops.sigmoid(logits) if scoring == "sigmoid" else ops.softmax(logits, -1)


def _gates(logits: Tensor, scores: Tensor, experts: np.ndarray, scoring: str) -> Tensor:
    """The chosen experts' weights before renormalising and scaling: their scores, or for
    "topk_softmax" the softmax over their logits."""
    if scoring == "topk_softmax":
        return ops.softmax(ops.gather_elements(logits, 1, Tensor(experts)), -1)
    return ops.gather_elements(scores, 1, Tensor(experts))


class TopKRouter(nn.Cell):
    """The router's parameters and options (see module docstring).

    Args:
        hidden: hidden size H.
        num_experts: E.
        top_k: experts per token (1 <= k <= E).
        normalize_top_k: renormalise the k chosen scores to sum to 1.
        noise_std: standard deviation of the Gaussian logit noise in training (0: none).
        seed: seed of the noise generator.
        num_groups: expert groups for group-limited routing (1: unlimited).
        topk_groups: groups a token may use; their experts must hold at least top_k.
        scoring: "softmax" over the experts, "sigmoid" per expert (DeepSeek-V3), or
            "topk_softmax": the top-k logits, weighted by their softmax (gpt-oss).
        score_bias: hold a per-expert bias added to the scores for the choice only
            (`score_bias`, [E], zeros, not trained by gradients: DeepSeek-V3's
            `e_score_correction_bias`, set by the user's balancing rule or a checkpoint).
        group_score: how group-limited routing ranks a group: "max" (its best score) or
            "top2_sum" (the sum of its two best: DeepSeek-V3).
        routed_scaling_factor: the chosen weights' factor (DeepSeek-V3's), > 0.
        bias: hold a learned bias added to the logits (`bias`, [E], zeros: gpt-oss's).

    Raises:
        ValueError: a size or option out of range (named in the message).
    """

    def __init__(self, hidden: int, num_experts: int, top_k: int, normalize_top_k: bool = True,
                 noise_std: float = 0.0, seed: int = 0, num_groups: int = 1, topk_groups: int = 1,
                 scoring: str = "softmax", score_bias: bool = False, group_score: str = "max",
                 routed_scaling_factor: float = 1.0, bias: bool = False):
        super().__init__()
        if hidden < 1 or num_experts < 1:
            raise ValueError(f"TopKRouter: hidden={hidden} and num_experts={num_experts} must be >= 1")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"TopKRouter: top_k={top_k} must be between 1 and num_experts={num_experts}")
        if noise_std < 0:
            raise ValueError(f"TopKRouter: noise_std={noise_std} must be >= 0")
        if num_groups < 1 or num_experts % num_groups:
            raise ValueError(f"TopKRouter: num_groups={num_groups} must divide num_experts={num_experts}")
        if num_groups > 1 and not (1 <= topk_groups <= num_groups and topk_groups * (num_experts // num_groups) >= top_k):
            raise ValueError(f"TopKRouter: topk_groups={topk_groups} must be in 1..num_groups={num_groups} and its "
                             f"groups must hold top_k={top_k} experts")
        if scoring not in SCORINGS:
            raise ValueError(f"TopKRouter: scoring={scoring!r}; expected one of {SCORINGS}")
        if group_score not in GROUP_SCORES:
            raise ValueError(f"TopKRouter: group_score={group_score!r}; expected one of {GROUP_SCORES}")
        if group_score == "top2_sum" and num_groups > 1 and num_experts // num_groups < 2:
            raise ValueError(f"TopKRouter: group_score='top2_sum' needs groups of at least 2 experts; "
                             f"num_experts={num_experts} in num_groups={num_groups} gives 1")
        for name, flag in (("score_bias", score_bias), ("bias", bias)):
            if not isinstance(flag, bool):
                raise ValueError(f"TopKRouter: {name}={flag!r} must be a bool")
        scale = routed_scaling_factor
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ValueError(f"TopKRouter: routed_scaling_factor={scale!r} must be a number > 0")
        self.num_groups, self.topk_groups, self.group_score = num_groups, topk_groups, group_score
        self.num_experts, self.top_k = num_experts, top_k
        self.normalize_top_k, self.noise_std = normalize_top_k, float(noise_std)
        self.scoring, self.routed_scaling_factor = scoring, float(scale)
        self._rng = np.random.default_rng(seed)
        self.weight = Parameter(initializer(Normal(0.02), (hidden, num_experts), ms.float32), name="weight")
        self.score_bias = (Parameter(Tensor(np.zeros(num_experts, np.float32)), name="score_bias", requires_grad=False)
                           if score_bias else None)
        self.bias = Parameter(Tensor(np.zeros(num_experts, np.float32)), name="bias") if bias else None

    def noise(self, num_tokens: int):
        """Logit noise for this call ([T, E] Tensor), or None outside training or without noise."""
        if not self.training or self.noise_std == 0.0:
            return None
        return Tensor(self._rng.normal(0.0, self.noise_std, (num_tokens, self.num_experts)).astype(np.float32))

    def route(self, tokens: Tensor, weight: Tensor, noise=None, bias: Tensor = None) -> Routing:
        """Route `tokens` [T, H] with `weight` and `bias` (this router's, or their copies as an
        expert-parallel call lays them out; `bias` None for a router without one)."""
        return route_tokens(tokens, weight, self.top_k, self.normalize_top_k, noise, self.num_groups, self.topk_groups,
                            self.scoring, self.score_bias, self.group_score, self.routed_scaling_factor, bias)

    def construct(self, tokens: Tensor) -> Routing:
        return self.route(tokens, self.weight, self.noise(tokens.shape[0]), self.bias)
