"""Small models the tests share (plain nn.Cells, nothing parallel in them)."""
import math

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.common.initializer import Normal


class MLP(nn.Cell):
    def __init__(self, d_in=16, d_hidden=32, d_out=16):
        super().__init__()
        self.fc1 = nn.Dense(d_in, d_hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Dense(d_hidden, d_out)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class DenseStack(nn.Cell):
    """`n_layers` square Dense layers with tanh, then a Dense head to one output: each layer a
    sub-Cell to offload (`layers.0`, ...)."""

    def __init__(self, n_layers=4, dim=32):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(dim, dim) for _ in range(n_layers)])
        self.head = nn.Dense(dim, 1)

    def construct(self, x):
        for layer in self.layers:
            x = ops.tanh(layer(x))
        return self.head(x)


class Attention(nn.Cell):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q = nn.Dense(hidden, hidden)
        # No key bias: softmax is shift-invariant, so its exact gradient is 0 and Adam would
        # amplify float rounding noise into full-size updates (in any two implementations).
        self.k = nn.Dense(hidden, hidden, has_bias=False)
        self.v = nn.Dense(hidden, hidden)
        self.proj = nn.Dense(hidden, hidden)

    def _split(self, x):
        b, t, _ = x.shape
        return x.reshape(b, t, self.heads, self.head_dim).transpose(0, 2, 1, 3)

    def construct(self, x, mask):
        b, t, h = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = ops.matmul(q, k.swapaxes(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores + mask
        probs = ops.softmax(scores, -1)
        ctx = ops.matmul(probs, v).transpose(0, 2, 1, 3).reshape(b, t, h)
        return self.proj(ctx)


class FeedForward(nn.Cell):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.up = nn.Dense(hidden, ffn)
        self.act = nn.GELU(approximate=False)
        self.down = nn.Dense(ffn, hidden)

    def construct(self, x):
        return self.down(self.act(self.up(x)))


class TransformerBlock(nn.Cell):
    """Pre-LN block: attention + MLP + LayerNorm with a causal mask."""

    def __init__(self, hidden=32, heads=4, ffn=64):
        super().__init__()
        self.ln1 = nn.LayerNorm((hidden,))
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm((hidden,))
        self.mlp = FeedForward(hidden, ffn)

    def construct(self, x):
        t = x.shape[1]
        mask = Tensor(np.triu(np.full((t, t), -1e9, np.float32), 1))
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class RMSNorm(nn.Cell):
    """RMSNorm from building blocks (pow, mean, rsqrt, mul)."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = ms.Parameter(Tensor(np.ones(hidden, np.float32)), name="weight")
        self.eps = eps

    def construct(self, x):
        var = (x * x).mean(-1, keep_dims=True)
        return x * ops.rsqrt(var + self.eps) * self.weight


class TinyLM(nn.Cell):
    """Embedding + block + RMSNorm + LM head, returning the mean cross-entropy loss."""

    def __init__(self, vocab=64, hidden=32, heads=4, ffn=64):
        super().__init__()
        # PyTorch's N(0, 1) embedding init (MindSpore's default is N(0, 0.01)), as in a migrated model
        self.embed = nn.Embedding(vocab, hidden, embedding_table=Normal(1.0))
        self.block = TransformerBlock(hidden, heads, ffn)
        self.norm = RMSNorm(hidden)
        self.head = nn.Dense(hidden, vocab, has_bias=False)
        self.loss = nn.CrossEntropyLoss()

    def construct(self, ids, labels):
        h = self.norm(self.block(self.embed(ids)))
        logits = self.head(h)
        b, t, v = logits.shape
        return self.loss(logits.reshape(b * t, v), labels.reshape(b * t))


class Classifier(nn.Cell):
    """TransformerEncoderLayer over padded sequences, mean-pooled, then a linear head."""

    def __init__(self, hidden=16, heads=4, classes=3):
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(hidden, heads, 2 * hidden, dropout=0.0, batch_first=True)
        self.head = nn.Dense(hidden, classes)
        self.loss = nn.CrossEntropyLoss()

    def construct(self, x, padding, labels=None):
        logits = self.head(self.encoder(x, src_key_padding_mask=padding).mean(1))
        return logits if labels is None else self.loss(logits, labels)


def copy_weights(src, dst):
    """Give `dst` the same parameter values as `src` (same architecture)."""
    for (_, p), (_, q) in zip(src.parameters_and_names(), dst.parameters_and_names()):
        q.set_data(p.data.copy())
