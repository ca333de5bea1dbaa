"""1-bit routing as MindSpore custom ops (aot, CPU; kernels in `ccsrc/moe/routing_kernels.cc`,
inside mindspore_hyper._core): `PackRouting()(mask)` -> uint8 [ceil(T*E/8)],
`UnpackRouting(T, E)(packed)` -> bool [T, E]. Same bit layout as `routing_bits.pack_routing`.
Not differentiable (masks are integers). Usable in PYNATIVE and GRAPH mode.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mindspore_hyper.ops.offload_ops import core_library

__all__ = ["PackRouting", "UnpackRouting"]


class PackRouting(nn.Cell):
    """mask [T, E] (bool or uint8 0/1) -> uint8 [ceil(T*E/8)]."""

    def __init__(self):
        super().__init__()
        self.op = ops.Custom(f"{core_library()}:MsHyperPackRouting", out_shape=lambda m: ((m[0] * m[1] + 7) // 8,),
                             out_dtype=lambda m: ms.uint8, func_type="aot")
        self.op.add_prim_attr("primitive_target", "CPU")

    def construct(self, mask):
        return self.op(mask)


class UnpackRouting(nn.Cell):
    """uint8 [ceil(T*E/8)] -> bool [T, E].

    Raises:
        ValueError: negative sizes.
    """

    def __init__(self, num_tokens: int, num_experts: int):
        super().__init__()
        if num_tokens < 0 or num_experts < 0:
            raise ValueError(f"UnpackRouting: num_tokens={num_tokens} and num_experts={num_experts} must be >= 0")
        shape = (int(num_tokens), int(num_experts))
        self.op = ops.Custom(f"{core_library()}:MsHyperUnpackRouting", out_shape=lambda p: shape,
                             out_dtype=lambda p: ms.bool_, func_type="aot")
        self.op.add_prim_attr("primitive_target", "CPU")
        # the output shape is not a function of the input's: keep MindSpore's caches apart
        self.op.add_prim_attr("mshyper_out_signature", f"{shape}")

    def construct(self, packed):
        return self.op(packed)
