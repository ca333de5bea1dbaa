"""Ops that write into their operands: in-place ops, Assign and other primitives that write
their first operand, and BatchNorm's moving statistics.

The dispatcher runs such an op by its out-of-place sharding rule and then writes the new value
back to what the caller passed: a DTensor takes the new shards in its own layout (`_become`), a
model Parameter laid out by the run gets the value stored into it (its global tensor in
simulation, its shard under msrun), and a plain Tensor gets the gathered value. So a DTensor
behaves like the documented in-place API on a single device. (MindSpore 2.10 on CPU computes
`t.add_(x)` and friends out of place on plain tensors and leaves `t` unchanged; `copy_`,
`ops.assign` and BatchNorm do write.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from mindspore import Tensor, ops
from mindspore._c_expression import NoFallbackGuard

from mindspore_hyper.dtensor.padded_storage import padded
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["Mutation", "mutation_of", "write_back"]

INPLACE_PREFIX = "Inplace"

# The out-of-place rule an op that writes its first operand runs by, where it is not the name
# without "Inplace" (an op without a rule runs replicated, which is always correct).
OUT_OF_PLACE = {
    "InplaceAddsExt": "AddScalar", "InplaceMaskedFillScalar": "MaskedFill", "InplaceMaskedFillTensor": "MaskedFill",
    "InplaceCopy": "Assign", "InplaceFloorDivide": "FloorDiv", "InplaceZero": "ZerosLike",
    "AssignAdd": "Add", "AssignSub": "Sub",
}

# Ops that write into operands other than their first: op name -> operand positions.
WRITES_OPERANDS = {"BatchNorm": (3, 4)}  # moving mean and variance, when training


@dataclass(frozen=True)
class Mutation:
    """How an op writes: `rule` is the sharding rule to run it by; `targets` the positions (in
    `OpCall.tensors`) it writes; `from_result` whether the new value is the op's (first) result
    (in-place ops, Assign) rather than the operand after the op ran (BatchNorm)."""

    rule: str
    targets: Tuple[int, ...]
    from_result: bool


def mutation_of(call) -> Optional[Mutation]:
    """The Mutation of `call`, or None for an op that writes nothing. Ops that write: names
    starting with "Inplace", primitives marked `side_effect_mem` (Assign, IndexAdd, ScatterAdd,
    ... write their first operand) and `WRITES_OPERANDS`."""
    name = call.name
    if name in WRITES_OPERANDS:
        return Mutation(name, WRITES_OPERANDS[name], False) if _training(call) else None
    if name.startswith(INPLACE_PREFIX) or call.attrs.get("side_effect_mem", False):
        default = name[len(INPLACE_PREFIX):] if name.startswith(INPLACE_PREFIX) else name
        return Mutation(OUT_OF_PLACE.get(name, default), (0,), True)
    return None


def _training(call) -> bool:
    flags = [v for v in call.inputs[5:6] if isinstance(v, bool)]
    return flags[0] if flags else bool(call.attrs.get("is_training", False))


def write_back(execution, source, written, updated):
    """Give `source` (what the caller passed) the value `updated` (a DTensor) of the operand
    that the op wrote; `written` is the DTensor the dispatcher made of `source`. Returns the
    object the caller sees as written (the source)."""
    from mindspore_hyper.dtensor.dtensor import DTensor

    if updated.dtype != written.dtype:
        updated = updated.astype(written.dtype)
    value = updated.redistribute(written.layout)
    if isinstance(source, DTensor) or written._parameter_id is not None:
        written._become(value)
    if written._parameter_id is not None:
        _store_parameter(execution, written._parameter_id, value)
    elif not isinstance(source, DTensor):
        _store(source, _gathered(value))
    return source


def _store_parameter(execution, parameter_id: int, value) -> None:
    slot = execution.parameters[parameter_id]
    if slot.local:  # this process's shard is the Parameter (padded where a piece would be empty: padded_storage)
        piece = value.local_shard(execution.local_ranks[0])
        _store(slot.param, padded(piece, slot.param.shape[0]) if piece.ndim else piece)
    else:
        _store(slot.param, _gathered(value))


def _gathered(value) -> Tensor:
    """The global value, gathered without accounting (a device writes its own shard locally)."""
    replicated = TensorLayout.replicated(value.layout.mesh, value.ndim)
    return value.redistribute(replicated, record=False).shards[()]


def _store(target: Tensor, value: Tensor) -> None:
    if value is target:
        return
    with NoFallbackGuard():
        ops.assign(target, value.astype(target.dtype) if value.dtype != target.dtype else value)
