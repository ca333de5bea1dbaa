"""Attention: scaled_dot_product_attention -> a matmul/softmax helper (MindSpore has no CPU kernel for it)."""
import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call, expect
from mindspore_hyper.migrate.mappings.registry import function

aten = torch.ops.aten


@function("helper scaled_dot_product_attention (mint.matmul, mint.softmax)", F.scaled_dot_product_attention,
          aten.scaled_dot_product_attention, foldable=False)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    expect(enable_gqa, (False,), "enable_gqa")
    return call("scaled_dot_product_attention", query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=is_causal, scale=scale)
