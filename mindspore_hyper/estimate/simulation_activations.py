"""The activation bytes the simulation's accounting reports for the examples' GPT.

The simulation (`report.memory[rank]["activations_peak"]`) counts every DTensor a training
forward creates, at its per-device shard size and real dtype (float32 for examples/models.py),
held until the step ends (the backward needs most of them). It is neither Korthikanti et al.'s
count (16-bit, only what the backward needs) nor a physical memory peak: a reshape or transpose
is a new tensor with its own bytes. The figure is the sum below, exact up to a few int32 index
tensors and the data-parallel fan-out bookkeeping.

The sum follows the op sequence of examples/models.py GPT on MindSpore 2.10 (measured by
recording the simulation's allocations op by op, see docs/estimate.md). With b = sequences per
data-parallel rank, s = seq_len, h = hidden, a = heads, f = ffn, v = vocab, e = float bytes,
elements per transformer layer:

    B = bsh, F = bsf, S = b*a*s^2
    LayerNorm 1: output B, gamma and beta laid out 2h
    qkv Dense: input reshape B, MatMul 3B, BiasAdd 3B, reshape 3B; reshape to heads 3B,
        split 3B, 3 transposes 3B; key transpose B
    scores MatMul S, / sqrt(d) S, mask (a plain tensor laid out per use) s^2, + mask S, softmax S
    context MatMul B, transpose B, reshape B; proj Dense: 4B (reshape, MatMul, BiasAdd, reshape)
    residual add B; LayerNorm 2: B + 2h
    fc1 Dense: reshape B, MatMul F, BiasAdd F, reshape F; GELU F; fc2 Dense: reshape F, MatMul B,
        BiasAdd B, reshape B; residual add B
    => 35B + 5F + 4S + s^2 + 4h

outside the layers (V = bsv):

    token Gather B and reshape B, position table output s*h, + B; final LayerNorm B + 2h;
    head reshape B, MatMul V, reshape V; loss reshape V; log-softmax 3V and 4 row vectors of bs;
    cross-entropy's gathers, masks and sums: 11 float vectors of bs, 13 float scalars,
    5 int32 index tensors of bs and one bool mask of bs.
"""
from __future__ import annotations

from mindspore_hyper.estimate.transformer_config import TransformerConfig

__all__ = ["simulation_activation_bytes", "check_simulation_architecture"]

INT32_BYTES, BOOL_BYTES = 4, 1


def check_simulation_architecture(config: TransformerConfig) -> None:
    """Raise ValueError unless `config` has the architecture of examples/models.py GPT.

    The count follows that model's op sequence: LayerNorm, fused qkv with biases, learned
    positions, GELU MLP, untied head, dense layers, multi-head attention.
    """
    required = {"norm": "layernorm", "bias": True, "gated_mlp": False, "learned_positions": True,
                "tied_embeddings": False, "experts": 0, "kv_heads": config.heads}
    for name, value in required.items():
        if getattr(config, name) != value:
            raise ValueError(f"activation_model='simulation' counts the op sequence of examples/models.py GPT, "
                             f"which has {name}={value!r}; got {name}={getattr(config, name)!r}")


def layer_elements(config: TransformerConfig, batch: int) -> int:
    """Elements of the DTensors one transformer layer's forward creates (see module docstring)."""
    b, s, h, a, f = batch, config.seq_len, config.hidden, config.heads, config.ffn
    return 35 * b * s * h + 5 * b * s * f + 4 * b * a * s * s + s * s + 4 * h


def simulation_activation_bytes(config: TransformerConfig, batch: int) -> int:
    """Bytes per device of every DTensor the simulated forward of the examples' GPT creates.

    Args:
        config: the model (architecture of examples/models.py GPT, see
            `check_simulation_architecture`); its dtype_bytes is the float element size.
        batch: sequences on one device (the global batch divided by the data-parallel size).

    Returns:
        Bytes per device, the simulation's `activations_peak` of a training step (within 5%,
        tested).

    Raises:
        ValueError: the architecture differs from the examples' GPT, or batch < 1.
    """
    check_simulation_architecture(config)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch={batch!r}: expected an int >= 1")
    b, s, h, v, e = batch, config.seq_len, config.hidden, config.vocab, config.dtype_bytes
    bs, bsh, bsv = b * s, b * s * h, b * s * v
    floats = config.layers * layer_elements(config, b) + 5 * bsh + s * h + 2 * h + 6 * bsv + 15 * bs + 13
    return floats * e + 5 * bs * INT32_BYTES + bs * BOOL_BYTES
