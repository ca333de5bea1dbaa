"""Auxiliary losses of a router, from their published formulas.

- Load balancing (Switch Transformer, Fedus et al. 2021, eq. 4; its top-k form as in GShard and
  Megatron-LM's `switch_load_balancing_loss_func`):
  ``aux = coef * E * sum_e f_e * P_e`` with ``f_e`` the fraction of the T*k routed token copies
  that chose expert e and ``P_e`` the mean router probability of expert e over the T tokens.
  Perfectly balanced routing (f_e = P_e = 1/E) gives exactly ``coef``.
- Router z-loss (ST-MoE, Zoph et al. 2022, eq. 5): ``z = coef * mean_t (logsumexp_e logits_te)^2``.

Both are written over sums so that expert parallelism can add the sums of every device's tokens
before dividing (the loss of the whole batch, as on one device).
"""
from __future__ import annotations

from mindspore import Tensor, ops

__all__ = ["load_balancing_loss", "z_loss", "logsumexp_square_sum"]


def load_balancing_loss(prob_sums: Tensor, copy_counts: Tensor, num_tokens: int, top_k: int, coef: float) -> Tensor:
    """Switch/GShard load-balancing loss from sums over the batch.

    Args:
        prob_sums: [E] sum over tokens of each expert's router probability (differentiable).
        copy_counts: [E] number of token copies routed to each expert (top-k choices, before
            capacity dropping; no gradient).
        num_tokens: T, tokens in the batch.
        top_k: k, copies per token.
        coef: the loss coefficient.

    Returns:
        The scalar loss.
    """
    num_experts = prob_sums.shape[0]
    f = copy_counts / float(num_tokens * top_k)
    p = prob_sums / float(num_tokens)
    return coef * num_experts * (f * p).sum()


def logsumexp_square_sum(logits: Tensor) -> Tensor:
    """sum over tokens of (logsumexp over experts of the logits)^2, for the z-loss."""
    return ops.square(ops.logsumexp(logits, -1)).sum()


def z_loss(logits: Tensor, coef: float) -> Tensor:
    """ST-MoE router z-loss of `logits` [T, E] (mean over tokens)."""
    return coef * logsumexp_square_sum(logits) / float(logits.shape[0])
