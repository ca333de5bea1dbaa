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


@function("ops.gather (padding_idx: helper padded_embedding)", aten.embedding)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq.value is not False:
        raise Unsupported("functional embedding with scale_grad_by_freq scales gradients by batch counts; not mapped")
    if padding_idx.value in (-1, None):
        return call("ops.gather", weight, indices, 0)
    if not isinstance(padding_idx.value, int) or padding_idx.value < 0:
        raise Unsupported(f"functional embedding with padding_idx={padding_idx.value!r} (a negative index is only "
                          "known relative to the table's rows)")
    return call("padded_embedding", weight, indices, padding_idx)  # that row gets no gradient, as in torch


@function("ops.gather", F.embedding)
def embedding_functional(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                         sparse=False):
    if max_norm.value is not None:
        raise Unsupported("F.embedding(max_norm=...) renormalises rows in place; MindSpore has no equivalent")
    return embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)
