"""The routed experts' work as timed ops: what each expert member's SwiGLU experts cost one
device, recorded in the accounting's op table (`Accounting.compute`, the rows the step-time model
times: `estimate/dryrun_time.py`).

The experts run on plain tensors inside the MoE engine (`expert_compute.run_experts`), which the
DTensor dispatcher does not see, so their ops are recorded here, as the engine computes them: per
local expert slot that received n > 0 rows (n x H input, F the slot's feed-forward width on this
device, its slice of F under tensor-parallel experts)

    gate = x @ w_gate      (n x H) @ (H x F)    2 n H F FLOPs   ExpertMatMul
    up   = x @ w_up        (n x H) @ (H x F)    2 n H F FLOPs   ExpertMatMul
    s    = sigmoid(gate)                        n F             ExpertSigmoid
    a    = gate * s                             n F             ExpertMul
    p    = a * up                               n F             ExpertMul
    out  = p @ w_down      (n x F) @ (F x H)    2 n F H FLOPs   ExpertMatMul

each op's bytes its operands read plus its result written, once (`dtensor.op_cost`'s
convention). These are forward ops: the step-time model times a training step's backward as twice
the forward, so a member's expert FLOPs per step are 3 x 6 n H F summed over its slots. Under a
routing assumption every expert member records its own rows (`member_loads.MemberLoads`: a
program of its own where they differ from the representative's); otherwise the representative
device's (device 0's learned loads in simulation, each process's own under msrun).
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple, Union

__all__ = ["ExpertOp", "expert_ops", "record_expert_ops"]

ExpertOp = Tuple[str, int, int]  # (op name, FLOPs, bytes) of one call on one device
Ops = Tuple[ExpertOp, ...]


def expert_ops(rows_per_slot: Sequence[int], hidden: int, ffn_local: int, itemsize: int,
               weight_itemsize: int) -> Ops:
    """The ops of one device's experts (see module docstring), slot by slot.

    Args:
        rows_per_slot: rows each local expert slot received (0: the slot runs nothing).
        hidden: H, elements per row.
        ffn_local: the experts' feed-forward width on this device (F, or its tensor-parallel slice).
        itemsize: bytes per element of the rows and the intermediate products.
        weight_itemsize: bytes per element of the expert weights.

    Returns:
        (op name, FLOPs, bytes) per op call, in the order the engine runs them.

    Raises:
        ValueError: a negative row count, or a size or itemsize below 1.
    """
    if min(hidden, ffn_local, itemsize, weight_itemsize) < 1:
        raise ValueError(f"expert_ops: hidden={hidden}, ffn_local={ffn_local}, itemsize={itemsize}, "
                         f"weight_itemsize={weight_itemsize}: expected each >= 1")
    if any(n < 0 for n in rows_per_slot):
        raise ValueError(f"expert_ops: rows_per_slot={list(rows_per_slot)}: expected counts >= 0")
    h, f, b, w = hidden, ffn_local, itemsize, weight_itemsize
    result = []
    for n in rows_per_slot:
        if n == 0:
            continue
        project = ("ExpertMatMul", 2 * n * h * f, (n * h + n * f) * b + h * f * w)  # gate and up
        result += [project, project,
                   ("ExpertSigmoid", n * f, 2 * n * f * b),
                   ("ExpertMul", n * f, 3 * n * f * b),
                   ("ExpertMul", n * f, 3 * n * f * b),
                   ("ExpertMatMul", 2 * n * f * h, (n * f + n * h) * b + f * h * w)]  # down
    return tuple(result)


def record_expert_ops(accounting, ops: Union[Ops, Dict[Tuple[int, ...], Ops]]) -> None:
    """Record `ops` (one device's, or ranks -> each expert member's) in `accounting`'s op table."""
    if isinstance(ops, dict):
        accounting.record_compute_by_ranks(ops)
    else:
        accounting.record_compute_calls(ops)
