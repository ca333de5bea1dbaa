"""Small encoder / language-model pairs from MindSpore nn layers for the pipeline tests."""
import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindspore_hyper.multimodal import Batch
from mindspore_hyper.multimodal.synthetic import random_image

VOCAB, WIDTH, TOKENS = 11, 16, 2


class TinyEncoder(nn.Cell):
    """Patchify conv -> Dense -> mean into TOKENS tokens: (B, 3, H, W) -> (B, TOKENS, WIDTH)."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 4, stride=4, pad_mode="valid", has_bias=True)
        self.proj = nn.Dense(8, WIDTH * TOKENS)
        self.act = nn.GELU()

    def construct(self, x):
        p = self.patch(x).mean(axis=(2, 3))
        return self.act(self.proj(p)).reshape(x.shape[0], TOKENS, WIDTH)


class TinyLM(nn.Cell):
    """Embedding + features -> LayerNorm -> Dense -> mean -> logits (B, VOCAB)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm((WIDTH,))
        self.mix = nn.Dense(WIDTH, WIDTH, activation="tanh")
        self.head = nn.Dense(WIDTH, VOCAB)

    def construct(self, features, text):
        h = ops.concat((features, self.embed(text)), axis=1)
        return self.head(self.mix(self.norm(h)).mean(axis=1))


def make_models(seed=0):
    ms.set_seed(seed)
    return TinyEncoder(), TinyLM()


def make_batches(num, size=2, seed=0, side=16, labels=True, duplicates_of=None):
    """`num` batches of `size` requests; `duplicates_of`: batch index -> earlier batch index whose
    images it repeats exactly (request ids stay distinct)."""
    rng = np.random.default_rng(seed)
    batches = []
    for b in range(num):
        if duplicates_of and b in duplicates_of:
            images = batches[duplicates_of[b]].images.copy()
        else:
            images = np.stack([random_image(rng, side, side) for _ in range(size)])
        text = rng.integers(0, VOCAB, size=(size, 3)).astype(np.int32)
        lab = rng.integers(0, VOCAB, size=(size,)).astype(np.int32) if labels else None
        batches.append(Batch(b, tuple(range(b * size, (b + 1) * size)), images, text, lab))
    return batches


def loss_fn(logits, labels):
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")(logits, labels)


def direct_outputs(encoder, lm, batch):
    return lm(encoder(ms.Tensor(batch.images)), ms.Tensor(batch.text)).asnumpy()
