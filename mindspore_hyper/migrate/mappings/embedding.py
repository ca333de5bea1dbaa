"""Embeddings: nn.Embedding -> nn.Embedding (weight -> embedding_table), functional embedding -> ops.gather."""
import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call
from mindspore_hyper.migrate.mappings.registry import Unsupported, function, module

aten = torch.ops.aten


@module(torch.nn.Embedding, "nn.Embedding", params={"weight": "embedding_table"})
def embedding_module(m: torch.nn.Embedding) -> str:
    if m.max_norm is not None:
        raise Unsupported("nn.Embedding(max_norm=...) renormalises rows in place; MindSpore has no equivalent")
    if m.scale_grad_by_freq:
        raise Unsupported("nn.Embedding(scale_grad_by_freq=True) has no MindSpore equivalent")
    if m.padding_idx is None:
        return f"nn.Embedding({m.num_embeddings}, {m.embedding_dim})"
    # MindSpore's padding_idx only zero-initialises the row; torch also keeps its gradient at zero
    return f"PaddingEmbedding({m.num_embeddings}, {m.embedding_dim}, padding_idx={m.padding_idx})"


@function("ops.gather", aten.embedding)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if padding_idx.value not in (-1, None) or scale_grad_by_freq.value:
        raise Unsupported("functional embedding with padding_idx/scale_grad_by_freq changes gradients; use nn.Embedding")
    return call("ops.gather", weight, indices, 0)


@function("ops.gather", F.embedding)
def embedding_functional(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                         sparse=False):
    if max_norm.value is not None:
        raise Unsupported("F.embedding(max_norm=...) renormalises rows in place; MindSpore has no equivalent")
    return embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)
