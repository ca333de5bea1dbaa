"""Korthikanti et al.'s Table 2 term by term against the dry run's count of one GPT layer.

Table 2 (`activations.py`) counts, per transformer layer and device, the tensors the backward
needs, at 2 bytes an element and 1 byte a dropout-mask element (Korthikanti et al. 2022, section
4.1). The dry run (and the simulation, which it equals byte for byte) counts every tensor a
training forward of examples/models.py's GPT makes, at its dtype's size (float32: 4 bytes), held
until the step ends. The two are the same sum over different term sets:

    dry-run bytes per layer = e x (stored elements + extra elements)
    Table 2 bytes per layer = 2 x stored elements + dropout bytes

- **stored**: the tensors Table 2 lists that the package's GPT makes; each is one DTensor of the
  dry run with the paper's element count (`table2_terms` in bytes / 2 == `dryrun_layer_elements`,
  name by name).
- **dropout** (Table 2 only): the package's GPT has no dropout, so the two sbh masks, the as^2b/t
  softmax-dropout mask and the 2as^2b/t dropout output are absent; the attention over values
  reads the softmax output, already stored.
- **extra** (dry run only): intermediates the backward does not need, which an op-by-op count
  holds: nn.Dense's 2-D reshapes and its MatMul before the bias, the reshape to heads and the
  split, the key's first transpose, the raw and scaled scores and the masked scores, the causal
  mask laid out for the add (s^2, replicated), the LayerNorms' mean and rstd (bs each) and their
  gamma and beta cast copies (h each); under tensor parallelism (t > 1) also the residual stream's
  all-reduced copy before each LayerNorm (the row-parallel output stays a partial sum through the
  residual add) and each row-parallel bias laid out as a partial sum (h each).

With b = micro-batch, s = seq_len, h = hidden, a = heads, t = tensor-parallel size, B = bsh,
F = 4bsh, S = b a s^2 (elements per device, [t > 1] = 1 under tensor parallelism):

    stored = 4B + 4B/t + 2F/t + S/t
    extra  = (8 + 2[t > 1]) B + 19B/t + 3F/t + 3S/t + s^2 + 4bs + (4 + 2[t > 1]) h

Table 2's rows 3-6 (sequence parallelism, selective and full recomputation) have no dry-run
counterpart: the package's GPT layout (`gpt_layout.py`) expresses neither.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Dict

from mindspore_hyper.estimate._checks import check_int

__all__ = ["table2_terms", "dryrun_layer_elements", "dryrun_layer_bytes", "DROPOUT_TERMS", "STORED_TERMS"]

# Table 2's per-layer tensors that the package's GPT (no dropout) does not make
DROPOUT_TERMS = ("softmax dropout mask", "softmax dropout output", "attention dropout mask", "mlp dropout mask")
# Table 2's per-layer tensors that the dry run holds too (same element count)
STORED_TERMS = ("layernorm 1 input", "qkv input", "q", "k", "softmax output", "v", "projection input",
                "layernorm 2 input", "fc1 input", "gelu input", "fc2 input (gelu output)")


def _check(seq_len: int, micro_batch: int, hidden: int, heads: int, tensor_parallel: int) -> None:
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("hidden", hidden), ("heads", heads),
                        ("tensor_parallel", tensor_parallel)):
        check_int(name, value, 1)
    if hidden % heads:
        raise ValueError(f"hidden={hidden}: expected a multiple of heads={heads}")
    if heads % tensor_parallel:
        raise ValueError(f"tensor_parallel={tensor_parallel}: expected a divisor of heads={heads} "
                         "(a column split holds whole heads)")


def table2_terms(seq_len: int, micro_batch: int, hidden: int, heads: int,
                 tensor_parallel: int = 1) -> Dict[str, Fraction]:
    """Table 2's per-layer tensors (rows 1 and 2: no recomputation, no sequence parallelism) in
    bytes per device, by name (section 4.1 of the paper); their sum is `activation_bytes_per_layer`.

    Args:
        seq_len, micro_batch, hidden, heads: s, b, h, a.
        tensor_parallel: t (a divisor of heads).

    Returns:
        name -> bytes (exact fractions).

    Raises:
        ValueError: a size that is not a positive int, or heads / hidden not divisible as required.
    """
    _check(seq_len, micro_batch, hidden, heads, tensor_parallel)
    s, b, h, a, t = seq_len, micro_batch, hidden, heads, Fraction(tensor_parallel)
    sbh, as2b = s * b * h, a * s * s * b
    return {
        "layernorm 1 input": 2 * Fraction(sbh), "qkv input": 2 * Fraction(sbh), "q": 2 * sbh / t, "k": 2 * sbh / t,
        "softmax output": 2 * as2b / t, "softmax dropout mask": as2b / t, "softmax dropout output": 2 * as2b / t,
        "v": 2 * sbh / t, "projection input": 2 * sbh / t, "attention dropout mask": Fraction(sbh),
        "layernorm 2 input": 2 * Fraction(sbh), "fc1 input": 2 * Fraction(sbh), "gelu input": 8 * sbh / t,
        "fc2 input (gelu output)": 8 * sbh / t, "mlp dropout mask": Fraction(sbh),
    }


def dryrun_layer_elements(seq_len: int, micro_batch: int, hidden: int, heads: int,
                          tensor_parallel: int = 1) -> Dict[str, int]:
    """Elements per device of every tensor one layer of examples/models.py's GPT holds in a dry-run
    (or simulated) training forward, by name: Table 2's stored tensors under the paper's names
    (STORED_TERMS), the others prefixed "extra: " (see module docstring). The layer's first
    tensor, its LayerNorm input, is the previous layer's last (the residual add), so each layer
    counts one.

    Args:
        seq_len, micro_batch, hidden, heads: s, b, h, a (ffn = 4h, as the GPT's).
        tensor_parallel: t, laid out by `gpt_layout.gpt_parallel_config` (a divisor of heads).

    Returns:
        name -> elements per device.

    Raises:
        ValueError: as `table2_terms`.
    """
    _check(seq_len, micro_batch, hidden, heads, tensor_parallel)
    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tensor_parallel
    big, ffn, scores = b * s * h, 4 * b * s * h, b * a * s * s
    sharded, ffn_t, scores_t = big // t, ffn // t, scores // t
    tp = 1 if t > 1 else 0
    return {
        "layernorm 1 input": big,  # the previous layer's residual add
        "extra: layernorm 1 gamma and beta cast": 2 * h, "extra: layernorm 1 mean and rstd": 2 * b * s,
        "extra: layernorm 1 input all-reduced": tp * big,
        "qkv input": big, "extra: qkv 2-D input": big,
        "extra: qkv MatMul, bias add, 3-D and per-head reshapes": 4 * 3 * sharded,
        "extra: q, k, v split": 3 * sharded, "extra: k transposed to heads first": sharded,
        "q": sharded, "v": sharded, "k": sharded,  # q and v transposed to heads first; k transposed for QK^T
        "extra: scores, scaled, masked": 3 * scores_t, "extra: causal mask laid out": s * s,
        "softmax output": scores_t,
        "extra: context, transposed, reshaped": 3 * sharded, "projection input": sharded,
        "extra: projection MatMul, bias add, 3-D reshape": 3 * big,
        "extra: projection bias as a partial sum": tp * h,
        "layernorm 2 input": big,  # the residual add after attention
        "extra: layernorm 2 gamma and beta cast": 2 * h, "extra: layernorm 2 mean and rstd": 2 * b * s,
        "extra: layernorm 2 input all-reduced": tp * big,
        "fc1 input": big, "extra: fc1 2-D input": big, "extra: fc1 MatMul, bias add": 2 * ffn_t,
        "gelu input": ffn_t, "fc2 input (gelu output)": ffn_t, "extra: fc2 2-D input": ffn_t,
        "extra: fc2 MatMul, bias add, 3-D reshape": 3 * big, "extra: fc2 bias as a partial sum": tp * h,
        # the residual add at the layer's end is the next layer's "layernorm 1 input"
    }


def dryrun_layer_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int, tensor_parallel: int = 1,
                       dtype_bytes: int = 4) -> int:
    """Bytes per device one GPT layer adds to the dry run's (and the simulation's) activation
    peak: every element of `dryrun_layer_elements` at `dtype_bytes` (the model's float size).

    Raises:
        ValueError: as `table2_terms`, or dtype_bytes < 1.
    """
    check_int("dtype_bytes", dtype_bytes, 1)
    return dtype_bytes * sum(dryrun_layer_elements(seq_len, micro_batch, hidden, heads, tensor_parallel).values())
