"""DeepSeek-V3's multi-head latent attention (MLA), causal, from MindSpore's own layers.

Queries and keys/values pass through low-rank latents (DeepSeek-V2 section 2.1, V3 section 2.1.1):

    c_q  = RMSNorm(x W_qa)                     [b, t, q_lora_rank]
    q    = c_q W_qb                            [b, t, heads, qk_nope + qk_rope], split into q_nope, q_pe
    c_kv, k_pe = x W_kva                       [b, t, kv_lora_rank], [b, t, qk_rope] (one rope key for all heads)
    k_nope, v  = RMSNorm(c_kv) W_kvb           [b, t, heads, qk_nope], [b, t, heads, v_head]
    q_pe, k_pe = RoPE(q_pe), RoPE(k_pe)        rotary positions on the rope parts only
    out  = softmax((q_nope k_nope^T + q_pe k_pe^T) / sqrt(qk_nope + qk_rope) + mask) v, heads joined, W_o

DeepSeek-V3: hidden 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64,
v_head 128 (187M parameters per layer). What is left out does not change a shape: YaRN's context
extension of the rotary frequencies and its softmax scale, and the inference-time absorption of
W_kvb into the query and output (a training step materialises k and v, as here).
"""
import math

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

__all__ = ["MLAttention", "RMSNorm", "rope_tables", "apply_rope"]


class RMSNorm(nn.Cell):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension (DeepSeek's latent norms)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = Parameter(ops.ones(dim, ms.float32), name="weight")
        self.eps = eps

    def construct(self, x):
        return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + self.eps) * self.weight


def rope_tables(seq: int, dim: int, theta: float = 10000.0):
    """(cos, sin) [seq, dim] of rotary position embedding in the half-split layout: frequency
    theta^(-2i/dim) for i < dim/2, repeated over both halves."""
    inv = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.outer(np.arange(seq, dtype=np.float64), inv)
    angles = np.concatenate([angles, angles], -1)
    return Tensor(np.cos(angles).astype(np.float32)), Tensor(np.sin(angles).astype(np.float32))


def apply_rope(x, cos, sin):
    """x [..., t, dim] rotated by position: x cos + rotate_half(x) sin, rotate_half([a, b]) = [-b, a]."""
    half = x.shape[-1] // 2
    a, b = ops.split(x, half, -1)
    return x * cos + ops.concat([-b, a], -1) * sin


class MLAttention(nn.Cell):
    """Causal multi-head latent attention (see module docstring); `construct(x, mask)` with x
    [b, t, hidden] and an additive mask [t, t].

    Args:
        hidden: model width.
        heads: attention heads.
        q_lora_rank: the query latent's width.
        kv_lora_rank: the key/value latent's width.
        qk_nope_head_dim: per head, the query/key part without positions.
        qk_rope_head_dim: per head, the rotary part (the key's shared by all heads).
        v_head_dim: per head, the value width.
        seq: the longest sequence (the rotary tables' length).

    Raises:
        ValueError: a size < 1 or an odd rotary width (named in the message).
    """

    def __init__(self, hidden: int, heads: int, q_lora_rank: int, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, seq: int):
        super().__init__()
        sizes = dict(hidden=hidden, heads=heads, q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank,
                     qk_nope_head_dim=qk_nope_head_dim, qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim,
                     seq=seq)
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MLAttention: {name}={value!r}; expected an int >= 1")
        if qk_rope_head_dim % 2:
            raise ValueError(f"MLAttention: qk_rope_head_dim={qk_rope_head_dim}; expected an even width (rotary "
                             "pairs)")
        self.heads, self.nope, self.rope, self.v_dim = heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.kv_rank = kv_lora_rank
        self.q_a = nn.Dense(hidden, q_lora_rank, has_bias=False)
        self.q_norm = RMSNorm(q_lora_rank)
        self.q_b = nn.Dense(q_lora_rank, heads * (qk_nope_head_dim + qk_rope_head_dim), has_bias=False)
        self.kv_a = nn.Dense(hidden, kv_lora_rank + qk_rope_head_dim, has_bias=False)
        self.kv_norm = RMSNorm(kv_lora_rank)
        self.kv_b = nn.Dense(kv_lora_rank, heads * (qk_nope_head_dim + v_head_dim), has_bias=False)
        self.o = nn.Dense(heads * v_head_dim, hidden, has_bias=False)
        self.cos, self.sin = rope_tables(seq, qk_rope_head_dim)
        self.scale = 1.0 / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)

    def construct(self, x, mask):
        b, t, _ = x.shape
        h = self.heads
        q = self.q_b(self.q_norm(self.q_a(x))).reshape(b, t, h, self.nope + self.rope).transpose(0, 2, 1, 3)
        q_nope, q_pe = ops.split(q, [self.nope, self.rope], -1)
        c_kv, k_pe = ops.split(self.kv_a(x), [self.kv_rank, self.rope], -1)
        kv = self.kv_b(self.kv_norm(c_kv)).reshape(b, t, h, self.nope + self.v_dim).transpose(0, 2, 1, 3)
        k_nope, v = ops.split(kv, [self.nope, self.v_dim], -1)
        cos, sin = self.cos[:t], self.sin[:t]
        q_pe = apply_rope(q_pe, cos, sin)
        k_pe = apply_rope(k_pe, cos, sin).reshape(b, 1, t, self.rope)  # one rotary key for every head
        scores = (ops.matmul(q_nope, k_nope.swapaxes(-1, -2)) + ops.matmul(q_pe, k_pe.swapaxes(-1, -2))) * self.scale
        ctx = ops.matmul(ops.softmax(scores + mask, -1), v)
        return self.o(ctx.transpose(0, 2, 1, 3).reshape(b, t, h * self.v_dim))
