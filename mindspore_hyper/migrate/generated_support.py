"""Code the generated Cell modules contain: containers mirroring torch modules, and MindSpore
compositions of torch functions that have no single MindSpore op with a CPU kernel.

The code generator copies the source of each helper a generated module uses into that module, so
the written file needs only MindSpore and NumPy. Each helper is checked against torch in
tests/migrate.
"""
import math

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, mint, nn, ops

__all__ = ["Module", "param", "scaled_dot_product_attention", "layer_norm", "diff", "PaddingEmbedding",
           "padded_embedding", "repeat_interleave", "slice_dim", "HELPERS"]


class Module(nn.Cell):
    """A container mirroring one torch module: its sub-Cells and Parameters under their torch names."""

    def __init__(self, /, **members):
        super().__init__()
        for name, member in members.items():
            setattr(self, name, member)


def param(shape, dtype=ms.float32, requires_grad=True):
    """A zero-filled Parameter of `shape`; the checkpoint fills in the torch values."""
    return Parameter(Tensor(np.zeros(shape), dtype), requires_grad=requires_grad)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """torch.nn.functional.scaled_dot_product_attention (boolean masks keep True positions)."""
    length, source = query.shape[-2], key.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    scores = mint.mul(mint.matmul(query, mint.transpose(key, -2, -1)), scale)
    if is_causal:
        keep = Tensor(np.tril(np.ones((length, source), np.bool_)))
        scores = ops.masked_fill(scores, mint.logical_not(keep), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == ms.bool_:
            scores = ops.masked_fill(scores, mint.logical_not(attn_mask), float("-inf"))
        else:
            scores = mint.add(scores, attn_mask)
    probs = mint.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        probs = ops.dropout(probs, p=dropout_p, training=True)
    return mint.matmul(probs, value)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm over the last len(normalized_shape) dimensions."""
    axis = -len(normalized_shape)
    if weight is None:
        weight = mint.ones(tuple(normalized_shape), dtype=x.dtype)
    if bias is None:
        bias = mint.zeros(tuple(normalized_shape), dtype=x.dtype)
    return ops.LayerNorm(begin_norm_axis=axis, begin_params_axis=axis, epsilon=eps)(x, weight, bias)[0]


class PaddingEmbedding(nn.Embedding):
    """nn.Embedding with torch's padding_idx: that row gets no gradient (MindSpore's only starts it at zero)."""

    def construct(self, ids):
        keep = ops.cast(mint.ne(ops.arange(0, self.vocab_size), self.padding_idx), self.embedding_table.dtype)
        keep = mint.reshape(keep, (-1, 1))
        table = mint.add(mint.mul(self.embedding_table, keep),
                         mint.mul(ops.stop_gradient(self.embedding_table), mint.sub(1, keep)))
        return ops.gather(table, ids, 0)


def padded_embedding(weight, ids, padding_idx):
    """torch's functional embedding with padding_idx: the rows of `ids`; row `padding_idx` gets no gradient."""
    keep = ops.cast(mint.ne(ops.arange(0, weight.shape[0]), padding_idx), weight.dtype)
    keep = mint.reshape(keep, (-1, 1))
    table = mint.add(mint.mul(weight, keep), mint.mul(ops.stop_gradient(weight), mint.sub(1, keep)))
    return ops.gather(table, ids, 0)


def repeat_interleave(x, repeats, dim=None):
    """torch.repeat_interleave with a whole number of repeats: each element `repeats` times along `dim`."""
    if dim is None:
        x, dim = mint.flatten(x), 0
    dim = dim % x.ndim
    shape = list(x.shape)
    expanded = mint.broadcast_to(mint.unsqueeze(x, dim + 1), tuple(shape[:dim + 1] + [repeats] + shape[dim + 1:]))
    return mint.reshape(expanded, tuple(shape[:dim] + [shape[dim] * repeats] + shape[dim + 1:]))


def diff(x, n=1, dim=-1, prepend=None, append=None):
    """torch.diff: the n-th forward difference along `dim`, after concatenating prepend/append."""
    if prepend is not None:
        x = mint.cat([prepend, x], dim)
    if append is not None:
        x = mint.cat([x, append], dim)
    for _ in range(n):
        length = x.shape[dim]
        x = mint.sub(mint.narrow(x, dim, 1, length - 1), mint.narrow(x, dim, 0, length - 1))
    return x


def slice_dim(x, dim, start, stop, step=1):
    """x[:, ..., start:stop:step] at dimension `dim` (>= 0), clipped as Python and torch clip. An empty result is
    made as zeros of its shape (it passes no gradient, as in torch): MindSpore 2.10's CPU StridedSliceGrad fails
    ("input memory out of bounds") on an empty slice (DeepSeek-V4's `kv[:, :usable]`, usable 0 below 128
    tokens). Generated where the slice was empty on the example inputs."""
    begin, end, stride = slice(start, stop, step).indices(x.shape[dim])
    if len(range(begin, end, stride)) == 0:
        shape = list(x.shape)
        shape[dim] = 0
        return mint.zeros(tuple(shape), dtype=x.dtype)
    return x[(slice(None),) * dim + (slice(begin, end, stride),)]


HELPERS = {"Module": Module, "param": param, "scaled_dot_product_attention": scaled_dot_product_attention,
           "layer_norm": layer_norm, "diff": diff, "PaddingEmbedding": PaddingEmbedding,
           "padded_embedding": padded_embedding, "repeat_interleave": repeat_interleave, "slice_dim": slice_dim}
