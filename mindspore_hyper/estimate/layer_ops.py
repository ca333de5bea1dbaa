"""FLOPs and bytes of one transformer layer's forward, per device and micro-batch, op by op.

Each op has a class that decides how it is timed (`op_seconds`): "matmul" (a GEMM: the roofline
max(FLOPs / (peak x matmul efficiency), bytes / (HBM bandwidth x memory efficiency))),
"attention" (the attention core's two batched GEMMs, timed as a matmul; a flash kernel at the
hardware's `efficiency.attention` where it has one) and "memory" (norms,
activations, bias-dropout-residual, softmax: bytes / (HBM bandwidth x memory efficiency)).

Notation: b micro-batch, s sequence, cp context parallel, T = b s / cp tokens on the device, h
hidden, a heads, d_h = h / a, g key/value heads, kv = ceil(g / t) d_h local key/value width, f
MLP width, t tensor parallel, e element bytes; Tn = T / t with sequence parallelism (norms and
dropouts run on a sequence shard), else T. Forward FLOPs (a multiply-add = 2 FLOPs):

=================  ========  ===========================================================
op                 class     FLOPs; bytes
=================  ========  ===========================================================
norm (x2)          memory    -; 2 Tn h e (read, write)
qkv                matmul    2 T h (h/t + 2 kv); e (T h + h (h/t + 2kv) + T (h/t + 2kv))
attention core     attention 4 b (a/t) (s/cp) s d_h (QK^T and AV over all s keys; a flash
                             kernel skips the causal half: x 1/2); e (T (h/t) 2 + 2 T kv)
scores             memory    materialised kernels only: (6e + 1) b (a/t) (s/cp) s (write
                             scores, softmax read/write, dropout read/write + 1-byte mask,
                             AV read)
projection         matmul    2 T (h/t) h; e (T h/t + h h/t + T h)
dropout-add (x2)   memory    -; Tn h (3e + 1)
mlp up (and gate)  matmul    2 T h (f/t) c, c = 2 gated else 1; e (T h + c h f/t + c T f/t)
activation         memory    -; T (f/t) e (2, or 3 gated)
mlp down           matmul    2 T (f/t) h; e (T f/t + f/t h + T h)
=================  ========  ===========================================================

MoE (experts > 0): a router GEMM 2 T h E, and the MLP rows run on T x top_k routed tokens with
(E / ep) experts' weights read.

Each GEMM op also carries its GEMMs' shapes (`Op.gemms`: qkv T x (h/t + 2kv) x h, ..., the
materialised attention core's (b a/t) heads of QK^T (s/cp) x s x d_h and AV (s/cp) x d_h x s; a
flash kernel's none): on a hardware with a `gemm_tiling` the matmul efficiency of each phase is
scaled by the tile and wave quantisation of its GEMMs (`gemm_tiling`; the backward's input and
weight gradients as their transposed shapes). Model FLOPs (for MFU) count the attention core in full (the
convention of Korthikanti et al.'s formula 72 B s l h^2 (1 + s/(6h) + V/(12hl))).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

from mindspore_hyper.estimate.gemm_tiling import GemmShape, backward_shapes, utilisation
from mindspore_hyper.estimate.hardware import Hardware
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["Op", "OP_CLASSES", "layer_forward_ops", "head_forward_ops", "op_seconds", "op_phase_seconds", "kernel_key",
           "FLASH_BACKWARD", "OPTIMIZER_KEY", "model_flops_per_token"]

FLASH_BACKWARD = 2.5  # FlashAttention-2 backward: 5 GEMMs against the forward's 2
OPTIMIZER_KEY = "optimizer (AdamWeightDecay) per parameter"  # kernels entry: (seconds per parameter, 0)

OP_CLASSES = ("matmul", "attention", "memory")


@dataclass(frozen=True)
class Op:
    """One op of a layer's forward, per device and micro-batch.

    Attributes:
        name: what it is ("qkv", "attention core", ...).
        kind: "matmul", "attention" or "memory" (how `op_seconds` times it).
        flops: floating-point operations executed.
        bytes: bytes read and written in device memory.
        weight_grad: the op has weights (its backward has a weight-gradient half).
        gemms: the forward's GEMMs (their FLOPs sum to `flops`), for the hardware's tile and wave
            quantisation; empty: shape-independent (memory ops, a flash attention kernel).
    """

    name: str
    kind: str
    flops: float
    bytes: float
    weight_grad: bool = False
    gemms: Tuple[GemmShape, ...] = ()


def _utilisation(shapes: Tuple[GemmShape, ...], hardware: Hardware) -> float:
    """The tile and wave utilisation of `shapes` on `hardware` (1.0 without a `gemm_tiling`)."""
    if hardware.gemm_tiling is None or not shapes:
        return 1.0
    return utilisation(shapes, hardware.gemm_tiling, hardware.peak_flops)


def _roofline(op: Op, hardware: Hardware, gemm_utilisation: float = 1.0) -> float:
    eff = hardware.efficiency
    memory = op.bytes / (hardware.memory_bandwidth * eff.memory)
    if op.kind == "memory":
        return memory + eff.op_overhead
    if op.kind == "attention" and hardware.attention == "flash" and eff.attention is not None:
        return max(op.flops / (hardware.peak_flops * eff.attention), memory) + eff.op_overhead
    return max(op.flops / (hardware.peak_flops * eff.matmul * gemm_utilisation), memory) + eff.op_overhead


def op_seconds(op: Op, hardware: Hardware) -> float:
    """Roofline time of `op`'s forward on `hardware` (see the module doc: the matmul efficiency
    times the tile and wave utilisation of its GEMMs where the hardware has a `gemm_tiling`), plus
    the hardware's per-launch op overhead."""
    return _roofline(op, hardware, _utilisation(op.gemms, hardware))


def kernel_key(op: Op) -> str:
    """The key of `op` in a Hardware's measured `kernels` table: its name, FLOPs and bytes (so a
    table measured at one job's shapes serves only ops of exactly those shapes)."""
    return f"{op.name} | {op.flops:.6g} FLOP | {op.bytes:.6g} B"


def op_phase_seconds(op: Op, hardware: Hardware) -> Tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of `op` on `hardware`.

    Measured (`hardware.kernels` has `kernel_key(op)`): the measured forward and backward, the
    backward of an op with weights split evenly between its two halves (two GEMMs of the
    forward's size). Otherwise from the roofline t = `op_seconds`: input gradient t for a GEMM
    (and t again for its weight gradient), 2 t for a memory op, 2 t for the attention core
    (FLASH_BACKWARD t with a flash kernel, which recomputes the scores).
    """
    measured = hardware.kernels.get(kernel_key(op))
    if measured is not None:
        forward, backward = measured
        return (forward, backward / 2, backward / 2) if op.weight_grad else (forward, backward, 0.0)
    t = op_seconds(op, hardware)
    if op.kind == "memory":
        return t, 2 * t, 0.0
    grads = tuple(backward_shapes(g) for g in op.gemms)
    if op.kind == "attention":
        if hardware.attention == "flash":
            return t, t * FLASH_BACKWARD, 0.0
        # materialised: each forward GEMM's two transposes (dQ, dK from QK^T; dP, dV from AV)
        return t, 2 * _roofline(op, hardware, _utilisation(tuple(g for pair in grads for g in pair), hardware)), 0.0
    backward_input = _roofline(op, hardware, _utilisation(tuple(i for i, _ in grads), hardware))
    weight = _roofline(op, hardware, _utilisation(tuple(w for _, w in grads), hardware)) if op.weight_grad else 0.0
    return t, backward_input, weight


def _dims(config: TransformerConfig, strategy: JobStrategy) -> Tuple[float, float, float, float, int]:
    t, cp = strategy.tensor, strategy.context_parallel
    tokens = config.micro_batch * config.seq_len / cp
    norm_tokens = tokens / t if strategy.sequence_parallel else tokens
    kv = math.ceil(config.kv_heads / t) * config.head_dim
    return tokens, norm_tokens, kv, config.ffn / t, config.dtype_bytes


def _mlp_ops(config: TransformerConfig, tokens: float, f_local: float, e: int, weight_copies: float,
             prefix: str) -> List[Op]:
    h = config.hidden
    c = 2 if config.gated_mlp else 1
    rows = tokens / weight_copies  # each expert's GEMM runs on its share of the routed tokens
    return [Op(f"{prefix}up", "matmul", 2 * tokens * h * f_local * c,
               e * (tokens * h + weight_copies * c * h * f_local + c * tokens * f_local), True,
               (GemmShape(weight_copies, rows, c * f_local, h, e),)),
            Op(f"{prefix}activation", "memory", 0.0, tokens * f_local * e * (3 if config.gated_mlp else 2)),
            Op(f"{prefix}down", "matmul", 2 * tokens * f_local * h,
               e * (tokens * f_local + weight_copies * f_local * h + tokens * h), True,
               (GemmShape(weight_copies, rows, h, f_local, e),))]


def layer_forward_ops(config: TransformerConfig, strategy: JobStrategy, attention_kernel: str = "flash") -> List[Op]:
    """The ops of one layer's forward on one device for one micro-batch (module doc).

    Args:
        config: the model and micro-batch.
        strategy: tensor, sequence, context and expert parallelism.
        attention_kernel: "flash" or "materialized" (a Hardware's `attention`).
    """
    c, st = config, strategy
    h, t, cp = c.hidden, st.tensor, st.context_parallel
    tokens, norm_tokens, kv, f_local, e = _dims(c, st)
    q_local = h / t
    heads_local = c.heads / t
    core_flops = 4 * c.micro_batch * heads_local * (c.seq_len / cp) * c.seq_len * c.head_dim
    scores = c.micro_batch * heads_local * (c.seq_len / cp) * c.seq_len
    batched, queries = c.micro_batch * heads_local, c.seq_len / cp
    core_gemms = () if attention_kernel == "flash" else (GemmShape(batched, queries, c.seq_len, c.head_dim, e),
                                                         GemmShape(batched, queries, c.head_dim, c.seq_len, e))
    ops = [Op("norm 1", "memory", 0.0, 2 * norm_tokens * h * e),
           Op("qkv", "matmul", 2 * tokens * h * (q_local + 2 * kv),
              e * (tokens * h + h * (q_local + 2 * kv) + tokens * (q_local + 2 * kv)), True,
              (GemmShape(1, tokens, q_local + 2 * kv, h, e),)),
           Op("attention core", "attention", core_flops / 2 if attention_kernel == "flash" else core_flops,
              e * (2 * tokens * q_local + 2 * tokens * kv), False, core_gemms)]
    if attention_kernel == "materialized":
        ops.append(Op("scores", "memory", 0.0, (6 * e + 1) * scores))
    ops += [Op("projection", "matmul", 2 * tokens * q_local * h, e * (tokens * q_local + h * q_local + tokens * h),
               True, (GemmShape(1, tokens, h, q_local, e),)),
            Op("dropout-add 1", "memory", 0.0, norm_tokens * h * (3 * e + 1)),
            Op("norm 2", "memory", 0.0, 2 * norm_tokens * h * e)]
    if c.experts:
        experts_local = c.experts / st.expert
        ops.append(Op("router", "matmul", 2 * tokens * h * c.experts, e * (tokens * h + h * c.experts), True,
                      (GemmShape(1, tokens, c.experts, h, e),)))
        ops += _mlp_ops(c, tokens * c.top_k, f_local, e, experts_local, "expert ")
    else:
        ops += _mlp_ops(c, tokens, f_local, e, 1, "mlp ")
    ops.append(Op("dropout-add 2", "memory", 0.0, norm_tokens * h * (3 * e + 1)))
    return ops


def head_forward_ops(config: TransformerConfig, strategy: JobStrategy) -> List[Op]:
    """The last stage's final norm, vocabulary-parallel LM head and fp32 cross-entropy."""
    tokens, norm_tokens, _, _, e = _dims(config, strategy)
    h, v_local = config.hidden, config.vocab / strategy.tensor
    return [Op("final norm", "memory", 0.0, 2 * norm_tokens * config.hidden * e),
            Op("lm head", "matmul", 2 * tokens * h * v_local, e * (tokens * h + h * v_local + tokens * v_local), True,
               (GemmShape(1, tokens, v_local, h, e),)),
            Op("cross-entropy", "memory", 0.0, tokens * v_local * (e + 4 + 4))]


def model_flops_per_token(config: TransformerConfig) -> float:
    """Training FLOPs per token of the whole model (3 x forward; no recomputation; attention in
    full; MoE: top_k experts per token), the MFU numerator."""
    c = config
    kv = c.kv_heads * c.head_dim
    attn = 2 * c.hidden * (c.hidden + 2 * kv) + 4 * c.seq_len * c.hidden + 2 * c.hidden * c.hidden
    mlp = 2 * c.hidden * c.ffn * (3 if c.gated_mlp else 2)
    if c.experts:
        mlp = mlp * c.top_k + 2 * c.hidden * c.experts
    return 3 * (c.layers * (attn + mlp) + 2 * c.hidden * c.vocab)
