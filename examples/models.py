"""A small GPT-style Transformer used by the examples (an ordinary nn.Cell, nothing parallel)."""
import math

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops


def float32_logits(logits):
    """The logits in float32 for the loss (a mixed-precision model's head computes them in
    bfloat16 or float16; the cross-entropy runs in float32, as amp O2's output cast makes it);
    float32 logits are returned as they are (no op)."""
    return logits if logits.dtype == ms.float32 else logits.astype(ms.float32)


class Attention(nn.Cell):
    """Multi-head causal self-attention with a fused qkv projection whose output features are laid
    out head by head, [heads, (q, k, v), head_dim] (Megatron-LM's layout): a column split of qkv
    over tensor-parallel devices holds whole heads, so attention runs on each device's heads alone."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Dense(hidden, 3 * hidden)
        self.proj = nn.Dense(hidden, hidden)

    def construct(self, x, mask):
        b, t, h = x.shape
        qkv = self.qkv(x).reshape(b, t, self.heads, 3 * self.head_dim)
        q, k, v = (part.transpose(0, 2, 1, 3) for part in ops.split(qkv, self.head_dim, -1))
        scores = ops.matmul(q, k.swapaxes(-1, -2)) / math.sqrt(self.head_dim) + mask
        ctx = ops.matmul(ops.softmax(scores, -1), v)
        return self.proj(ctx.transpose(0, 2, 1, 3).reshape(b, t, h))


class Block(nn.Cell):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm((hidden,))
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm((hidden,))
        self.fc1 = nn.Dense(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Dense(4 * hidden, hidden)

    def construct(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class GPT(nn.Cell):
    """Token embedding + position embedding + blocks + LM head; returns the cross-entropy loss
    when labels are given, else the logits."""

    def __init__(self, vocab: int = 128, hidden: int = 64, heads: int = 4, layers: int = 2, seq: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.CellList([Block(hidden, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm((hidden,))
        self.head = nn.Dense(hidden, vocab, has_bias=False)
        self.loss = nn.CrossEntropyLoss()
        self.mask = Tensor(np.triu(np.full((seq, seq), -1e9, np.float32), 1))
        self.positions = Tensor(np.arange(seq, dtype=np.int32))

    def construct(self, ids, labels=None):
        x = self.embed(ids) + self.pos(self.positions)
        for block in self.blocks:
            x = block(x, self.mask)
        logits = self.head(self.ln_f(x))
        if labels is None:
            return logits
        b, t, v = logits.shape
        return self.loss(float32_logits(logits).reshape(b * t, v), labels.reshape(b * t))


class HeadLayer(nn.Cell):
    """A last pipeline layer: final LayerNorm and LM head (the logits)."""

    def __init__(self, ln_f, head):
        super().__init__(auto_prefix=False)  # the wrapped cells keep their Parameters' names
        self.ln_f, self.head = ln_f, head

    def construct(self, x):
        return self.head(self.ln_f(x))


class EmbedLayer(nn.Cell):
    """A first pipeline layer: token embedding (plus position embedding when given)."""

    def __init__(self, embed, pos=None, positions=None):
        super().__init__(auto_prefix=False)
        self.embed, self.pos, self.positions = embed, pos, positions

    def construct(self, ids):
        x = self.embed(ids)
        return x if self.pos is None else x + self.pos(self.positions)


class MaskedBlock(nn.Cell):
    """A block as a one-input pipeline layer (the causal mask held)."""

    def __init__(self, block, mask):
        super().__init__(auto_prefix=False)
        self.block, self.mask = block, mask

    def construct(self, x):
        return self.block(x, self.mask)


class PipelinedGPT(GPT):
    """GPT as an explicit chain of layers (`pipeline_layers`, `pipeline_loss`): pipeline stages
    are cut without tracing a forward on values (what a dry run needs)."""

    def pipeline_layers(self):
        return [EmbedLayer(self.embed, self.pos, self.positions)] + [MaskedBlock(b, self.mask) for b in self.blocks] + \
            [HeadLayer(self.ln_f, self.head)]

    def pipeline_loss(self, logits, labels):
        b, t, v = logits.shape
        return self.loss(float32_logits(logits).reshape(b * t, v), labels.reshape(b * t))
