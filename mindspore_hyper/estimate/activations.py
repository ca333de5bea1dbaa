"""Activation memory of one transformer layer: Korthikanti et al. 2022, Table 2.

V. Korthikanti, J. Casper, S. Lym, L. McAfee, M. Andersch, M. Shoeybi, B. Catanzaro, "Reducing
Activation Recomputation in Large Transformer Models" (arXiv:2205.05198), Table 2, "Activations
memory per transformer layer": 16-bit activations, 1-byte dropout masks, the GPT layer of the
paper (attention with materialised scores, GELU MLP of width 4h).
"""
from __future__ import annotations

from fractions import Fraction

from mindspore_hyper.estimate._checks import check_bool, check_choice, check_int

__all__ = ["activation_bytes_per_layer", "RECOMPUTE_MODES", "TABLE2_ROWS", "table2_row"]

RECOMPUTE_MODES = ("none", "selective", "full")

TABLE2_ROWS = {  # row number -> the paper's configuration and formula
    1: "no parallelism: sbh(34 + 5as/h)",
    2: "tensor parallel (baseline): sbh(10 + 24/t + 5as/(ht))",
    3: "tensor + sequence parallel: sbh(34/t + 5as/(ht))",
    4: "tensor parallel + selective activation recomputation: sbh(10 + 24/t)",
    5: "tensor parallel + sequence parallel + selective activation recomputation: sbh(34/t)",
    6: "full activation recomputation: sbh(2)",
}


def table2_row(tensor_parallel: int, sequence_parallel: bool, recompute: str) -> int:
    """The Table 2 row (1-6, a key of TABLE2_ROWS) used for this combination; see
    `activation_bytes_per_layer`."""
    check_choice("recompute", recompute, RECOMPUTE_MODES)
    if recompute == "full":
        return 6
    if recompute == "selective":
        return 5 if sequence_parallel else 4
    if sequence_parallel:
        return 3
    return 2 if tensor_parallel > 1 else 1


def activation_bytes_per_layer(seq_len: int, micro_batch: int, hidden: int, heads: int, tensor_parallel: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Bytes of activations one transformer layer stores for its backward, per device (Table 2).

    With s = seq_len, b = micro_batch, h = hidden, a = heads, t = tensor_parallel, the row used:

    =========  ====================  ==================================  ==================
    recompute  sequence_parallel     formula (bytes)                     Table 2 row
    =========  ====================  ==================================  ==================
    none       False, t = 1          sbh(34 + 5as/h)                     1 no parallelism
    none       False, t > 1          sbh(10 + 24/t + 5as/(ht))           2 tensor parallel
    none       True                  sbh(34/t + 5as/(ht))                3 tensor + sequence
    selective  False                 sbh(10 + 24/t)                      4 TP + selective
    selective  True                  sbh(34/t)                           5 TP + SP + selective
    full       any                   2sbh                                6 full recompute
    =========  ====================  ==================================  ==================

    Rows 2-5 at t = 1 reduce to row 1 (or to 34sbh with selective recompute). Row 6 is the
    table's: only each layer's input is stored, 2sbh, not divided by t even with sequence
    parallelism (the table does not give that variant).

    Args:
        seq_len: sequence length s (tokens).
        micro_batch: micro-batch size b (sequences per device).
        hidden: hidden size h.
        heads: attention heads a.
        tensor_parallel: tensor-parallel size t.
        sequence_parallel: Megatron sequence parallelism over the tensor-parallel group.
        recompute: "none", "selective" (attention core recomputed) or "full" (whole layer).

    Returns:
        Bytes per device (a float: the table's fractions are kept exactly until the end).

    Raises:
        ValueError: a size that is not a positive int, or an unknown recompute mode.
    """
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("hidden", hidden), ("heads", heads),
                        ("tensor_parallel", tensor_parallel)):
        check_int(name, value, 1)
    check_bool("sequence_parallel", sequence_parallel)
    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tensor_parallel
    row = table2_row(t, sequence_parallel, recompute)
    sbh = Fraction(s * b * h)
    scores = Fraction(5 * a * s, h * t)  # 5as/(ht): attention scores, softmax, its dropout mask
    factor = {
        1: 34 + scores,
        2: 10 + Fraction(24, t) + scores,
        3: Fraction(34, t) + scores,
        4: 10 + Fraction(24, t),
        5: Fraction(34, t),
        6: Fraction(2),
    }[row]
    return float(sbh * factor)
