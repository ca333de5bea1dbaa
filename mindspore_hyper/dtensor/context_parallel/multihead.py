"""`nn.MultiheadAttention` under context parallelism (so `nn.TransformerEncoderLayer`,
`nn.TransformerDecoderLayer`'s self-attention and `nn.Transformer*` models).

MindSpore's `multi_head_attention_forward` always forms the attention weights (it averages
them even when they are not returned), which context parallelism must not do. `install` gives
each MultiheadAttention of a model a `construct` that, when its query is a DTensor of a
context-parallel run, computes self-attention by the same formula (packed in-projection,
q and k scaled by hd^-1/4 each, the float or boolean `attn_mask` and `key_padding_mask` added as
-inf / additive masks, softmax, output projection) through `attend`; any other call runs the
original `construct`.
"""
from __future__ import annotations

import math
import types

from mindspore import nn, ops

import mindspore as ms
from mindspore_hyper.dtensor.context_parallel.attend import attend
from mindspore_hyper.dtensor.context_parallel.scores import AttentionScores, Step
from mindspore_hyper.dtensor.dtensor import DTensor

__all__ = ["install"]


def install(network: nn.Cell) -> int:
    """Give every nn.MultiheadAttention in `network` the context-parallel construct (idempotent).

    Returns:
        How many MultiheadAttention Cells the network has.
    """
    count = 0
    for _, cell in network.cells_and_names():
        if isinstance(cell, nn.MultiheadAttention):
            count += 1
            if "construct" not in cell.__dict__:
                cell.construct = types.MethodType(_construct, cell)
    return count


def _construct(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
               average_attn_weights=True):
    context = query.execution.context_parallel if isinstance(query, DTensor) else None
    if context is None:
        return type(self).construct(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                                    average_attn_weights)
    _check(self, need_weights)
    if query.ndim != 3:
        raise ValueError(f"nn.MultiheadAttention under context parallelism: query of shape {tuple(query.shape)}; "
                         "expected a batched 3-D input")
    x = query if self.batch_first else query.swapaxes(0, 1)  # [b, t, e]
    b, t, e = x.shape
    heads = self.num_heads
    hd = e // heads
    q, k, v = ops.matmul(x, self.in_proj_weight.swapaxes(-1, -2)).tensor_split(3, axis=-1) \
        if self.in_proj_bias is None else \
        (ops.matmul(x, self.in_proj_weight.swapaxes(-1, -2)) + self.in_proj_bias).tensor_split(3, axis=-1)
    q, k, v = [y.reshape(b, t, heads, hd).transpose(0, 2, 1, 3) for y in (q, k, v)]  # [b, h, t, hd]
    scaling = math.sqrt(math.sqrt(hd))
    steps = []
    for mask, shape in ((attn_mask, None), (key_padding_mask, (b, 1, 1, t))):
        if mask is not None:
            steps.append(Step("add", mask=_additive(mask, q.dtype, shape, b, heads, t)))
    scores = AttentionScores(q / scaling, k.swapaxes(-2, -1) / scaling, tuple(steps), softmax=True)
    out = attend(query.execution, scores, v)  # [b, h, t, hd]
    out = out.transpose(0, 2, 1, 3).reshape(b, t, e)
    out = ops.matmul(out, self.out_proj.weight.swapaxes(-1, -2))
    if self.out_proj.bias is not None:
        out = out + self.out_proj.bias
    return (out if self.batch_first else out.swapaxes(0, 1),)


def _check(cell, need_weights: bool) -> None:
    what = "nn.MultiheadAttention under context parallelism"
    if need_weights:
        raise ValueError(f"{what}: need_weights=True asks for the [t, s] attention weights, which context "
                         "parallelism never forms; call it with need_weights=False")
    if not (cell.q_is_k and cell.k_is_v):
        raise ValueError(f"{what}: only self-attention (query is key is value) is supported")
    if not cell._qkv_same_embed_dim or cell.bias_k is not None or cell.add_zero_attn:
        raise ValueError(f"{what}: kdim/vdim, add_bias_kv and add_zero_attn are not supported")
    if cell.training and float(cell.dropout) > 0.0:
        raise ValueError(f"{what}: attention dropout {cell.dropout} in training is not supported; use dropout=0.0")


def _additive(mask, dtype, shape, b: int, heads: int, t: int):
    """A float (additive) or boolean (True = masked: -inf) mask as an additive one broadcasting
    to [b, h, t, s]."""
    if mask.dtype == ms.bool_:
        zeros = ops.zeros_like(mask, dtype=dtype)
        mask = ops.masked_fill(zeros, mask, float("-inf"))
    elif mask.dtype == ms.uint8:
        raise ValueError("nn.MultiheadAttention under context parallelism: uint8 masks are not supported; "
                         "pass a bool or float mask")
    if shape is not None:
        return mask.reshape(shape)
    if mask.ndim == 3:
        return mask.reshape(b, heads, t, mask.shape[-1])
    return mask
