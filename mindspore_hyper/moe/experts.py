"""Experts as batched weights, and the DeepSeek-V3 shared expert.

Routed experts are SwiGLU feed-forward blocks, ``y = (silu(x Wg) * (x Wu)) Wd``, stored as three
batched Parameters (expert dimension first) so a strategy can split the expert dimension over an
expert mesh axis and the feed-forward dimension over a tensor axis:
``w_gate`` [E, H, F], ``w_up`` [E, H, F], ``w_down`` [E, F, H]. gpt-oss's experts add biases
(``b_gate``, ``b_up`` [E, F], ``b_down`` [E, H]) and clamp the SwiGLU:
``g = min(x Wg + bg, limit)``, ``u = clip(x Wu + bu, -limit, limit)``,
``y = ((u + 1) * g * sigmoid(alpha g)) Wd + bd`` (`activation="clamped_swiglu"`).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer

from mindspore_hyper.moe.token_dispatch import DispatchPlan

__all__ = ["ACTIVATIONS", "GroupedExperts", "SharedExpert", "swiglu", "run_experts", "combine_copies"]


ACTIVATIONS = ("swiglu", "clamped_swiglu")


def swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor, b_gate: Tensor = None, b_up: Tensor = None,
           b_down: Tensor = None, clamp: Optional[Tuple[float, float]] = None) -> Tensor:
    """One expert on rows `x` [N, H] with its weights [H, F], [H, F], [F, H], its biases [F], [F],
    [H] (or None) and, for gpt-oss's clamped SwiGLU, `clamp` = (alpha, limit)."""
    g = ops.matmul(x, w_gate)
    u = ops.matmul(x, w_up)
    if b_gate is not None:
        g, u = g + b_gate, u + b_up
    if clamp is None:
        h = g * ops.sigmoid(g) * u
    else:
        alpha, limit = clamp
        g = ops.clamp(g, max=limit)
        u = ops.clamp(u, -limit, limit)
        h = (u + 1) * (g * ops.sigmoid(g * alpha))
    out = ops.matmul(h, w_down)
    return out if b_down is None else out + b_down


class GroupedExperts(nn.Cell):
    """E routed experts' weights (see module docstring).

    Args:
        num_experts: E.
        hidden: H.
        ffn_hidden: F.
        bias: hold biases `b_gate`, `b_up` [E, F] and `b_down` [E, H] (gpt-oss), zeros.
        activation: "swiglu" or "clamped_swiglu" (gpt-oss: `alpha`, `limit`).
        alpha: the clamped SwiGLU's sigmoid slope.
        limit: the clamped SwiGLU's bound (> 0).

    Raises:
        ValueError: a size < 1 or an option out of range (named in the message).
    """

    def __init__(self, num_experts: int, hidden: int, ffn_hidden: int, bias: bool = False,
                 activation: str = "swiglu", alpha: float = 1.702, limit: float = 7.0):
        super().__init__()
        if min(num_experts, hidden, ffn_hidden) < 1:
            raise ValueError(f"GroupedExperts: num_experts={num_experts}, hidden={hidden}, ffn_hidden={ffn_hidden} "
                             "must all be >= 1")
        if activation not in ACTIVATIONS:
            raise ValueError(f"GroupedExperts: activation={activation!r}; expected one of {ACTIVATIONS}")
        if not isinstance(bias, bool):
            raise ValueError(f"GroupedExperts: bias={bias!r} must be a bool")
        if activation == "clamped_swiglu" and not (_number(alpha) and _number(limit) and limit > 0):
            raise ValueError(f"GroupedExperts: alpha={alpha!r} must be a number and limit={limit!r} a number > 0")
        self.num_experts = num_experts
        self.clamp = (float(alpha), float(limit)) if activation == "clamped_swiglu" else None
        self.w_gate = Parameter(initializer(Normal(0.05), (num_experts, hidden, ffn_hidden), ms.float32), name="w_gate")
        self.w_up = Parameter(initializer(Normal(0.05), (num_experts, hidden, ffn_hidden), ms.float32), name="w_up")
        self.w_down = Parameter(initializer(Normal(0.05), (num_experts, ffn_hidden, hidden), ms.float32), name="w_down")
        self.has_bias = bias
        if bias:
            self.b_gate = Parameter(Tensor(np.zeros((num_experts, ffn_hidden), np.float32)), name="b_gate")
            self.b_up = Parameter(Tensor(np.zeros((num_experts, ffn_hidden), np.float32)), name="b_up")
            self.b_down = Parameter(Tensor(np.zeros((num_experts, hidden), np.float32)), name="b_down")

    def biases(self) -> List[Parameter]:
        """[b_gate, b_up, b_down], or [] without biases."""
        return [self.b_gate, self.b_up, self.b_down] if self.has_bias else []


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class SharedExpert(nn.Cell):
    """An always-active SwiGLU block every token passes through (DeepSeek-V3's shared expert);
    with `gated`, its output scaled per token by sigmoid(x . w) (Qwen2-MoE's `shared_expert_gate`).
    Plain Dense layers, so tensor parallelism comes from the strategy's overrides."""

    def __init__(self, hidden: int, ffn_hidden: int, gated: bool = False):
        super().__init__()
        self.gate = nn.Dense(hidden, ffn_hidden, has_bias=False)
        self.up = nn.Dense(hidden, ffn_hidden, has_bias=False)
        self.down = nn.Dense(ffn_hidden, hidden, has_bias=False)
        self.gate_score = nn.Dense(hidden, 1, has_bias=False) if gated else None

    def construct(self, x):
        g = self.gate(x)
        out = self.down(g * ops.sigmoid(g) * self.up(x))
        if self.gate_score is not None:
            out = ops.sigmoid(self.gate_score(x)) * out
        return out


def run_experts(tokens: Tensor, plan: DispatchPlan, w_gate: Tensor, w_up: Tensor, w_down: Tensor,
                experts: Sequence[int] = None, biases: Sequence[Tensor] = (),
                clamp: Optional[Tuple[float, float]] = None) -> List[Tensor]:
    """Every expert's output on the tokens the plan sends it (None for an expert with none);
    `experts`: which experts' weights the batched tensors hold (default: all, in order);
    `biases`: the batched (b_gate, b_up, b_down), or () for none; `clamp`: see `swiglu`."""
    experts = range(plan.num_experts) if experts is None else experts
    wg, wu, wd = ops.unstack(w_gate, 0), ops.unstack(w_up, 0), ops.unstack(w_down, 0)
    bias_rows = [ops.unstack(b, 0) for b in biases]
    outs: List[Tensor] = []
    for local, e in enumerate(experts):
        if len(plan.tokens[e]) == 0:
            outs.append(None)
            continue
        rows = ops.gather(tokens, Tensor(plan.tokens[e].astype(np.int32)), 0)
        outs.append(swiglu(rows, wg[local], wu[local], wd[local], *[b[local] for b in bias_rows], clamp=clamp))
    return outs


def combine_copies(plan: DispatchPlan, outputs: Sequence[Tensor], gates: Tensor, hidden: int, dtype) -> Tensor:
    """Each token's output: the gate-weighted sum of its kept copies' expert outputs
    (`outputs[e]` rows in the plan's token order for expert e; dropped copies add nothing)."""
    rows, token_ids, flat_slots = [], [], []
    top_k = gates.shape[1]
    for e, out in enumerate(outputs):
        if out is None:
            continue
        rows.append(out)
        token_ids.append(plan.tokens[e])
        flat_slots.append(plan.tokens[e] * top_k + plan.slots[e])
    if not rows:
        return ops.zeros((plan.num_tokens, hidden), dtype)
    token_ids = Tensor(np.concatenate(token_ids).astype(np.int32))
    weights = ops.gather(gates.reshape(-1), Tensor(np.concatenate(flat_slots).astype(np.int32)), 0)
    weighted = ops.concat(rows, 0) * weights.astype(dtype).reshape(-1, 1)
    return ops.unsorted_segment_sum(weighted, token_ids, plan.num_tokens)
