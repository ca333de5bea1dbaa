"""What one op costs a device: floating-point operations and bytes moved, from the local shapes
of its operands and results (one device's shard; the dry run times them by the roofline).

Matrix products count 2 x (output elements) x (inner dimension) FLOPs; every other op one FLOP
per output element. Bytes are the operands read plus the results written (each once: an upper
bound of a fused kernel's traffic, a lower bound of an unfused one's).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Sequence, Tuple

__all__ = ["op_flops", "MATMULS"]

# op name -> positions of (transpose_a, transpose_b) among the inputs, or None (no transposes)
MATMULS: Dict[str, Any] = {"MatMul": (2, 3), "BatchMatMul": (2, 3), "MatMulExt": None, "BatchMatMulExt": None,
                           "Bmm": None, "BmmExt": None, "Dense": None}


def op_flops(name: str, inputs: Sequence[Any], in_shapes: Sequence[Tuple[int, ...]],
             out_shapes: Sequence[Tuple[int, ...]], attrs: Dict[str, Any]) -> int:
    """FLOPs of op `name` on one device (see module docstring). `inputs` are the op's local
    operands (for transpose flags), `in_shapes` the shapes of its tensor operands in order."""
    out_elements = sum(math.prod(s) for s in out_shapes)
    if name not in MATMULS or len(in_shapes) < 2 or not out_shapes:
        return out_elements
    a = in_shapes[0]
    flags = MATMULS[name]
    transpose_a = False
    if flags is not None:
        position = flags[0]
        value = inputs[position] if len(inputs) > position else attrs.get("transpose_a", False)
        transpose_a = bool(value) if isinstance(value, (bool, int)) else False
    if name == "Dense":
        inner = a[-1]
    elif len(a) == 1:
        inner = a[0]
    else:
        inner = a[-2] if transpose_a else a[-1]
    return 2 * math.prod(out_shapes[0]) * inner
