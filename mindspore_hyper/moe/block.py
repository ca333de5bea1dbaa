"""`MoEBlock`: a residual MoE feed-forward layer for chains of layers (pipeline stages).

A pipeline stage passes one tensor on, so the block returns x + MoE(x) and hands the router's
auxiliary loss to the active `pipeline.AuxLosses` (each stage's computation collects its
stage's terms, adds them to its objective and to the step's loss; on one device the model's
construct collects them). Without a collector it raises rather than drop the loss.
"""
from __future__ import annotations

from typing import Hashable

from mindspore import nn

from mindspore_hyper.moe.layer import MoE
from mindspore_hyper.pipeline.aux_loss import add_aux_loss

__all__ = ["MoEBlock"]


class MoEBlock(nn.Cell):
    """x -> x + MoE(x), the auxiliary loss to `add_aux_loss`.

    Args:
        hidden, ffn_hidden, num_experts: as `MoE`.
        **moe_options: the other `MoE` arguments (top_k, aux_loss_coef, dispatch, ...).
    """

    def __init__(self, hidden: int, ffn_hidden: int, num_experts: int, **moe_options):
        super().__init__()
        self.moe = MoE(hidden, ffn_hidden, num_experts, **moe_options)

    def construct(self, x, microbatch: Hashable = 0):
        y, aux = self.moe(x, microbatch)
        add_aux_loss(aux, "MoEBlock")
        return x + y
