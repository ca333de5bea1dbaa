"""Models of the migration tests: small torch models, their hand-written MindSpore twins, tiny
transformers configs (random weights, nothing downloaded), and comparison helpers."""
import math

import numpy as np
import torch
import mindspore as ms
from mindspore import mint, nn

from mindspore_hyper.migrate.compare import cell_outputs, relative_error, to_mindspore, torch_outputs

TOL = 1e-5


class TorchMLP(torch.nn.Module):
    def __init__(self, d_in=16, d_hidden=32, d_out=8):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class MsMLP(nn.Cell):
    """The MLP written by hand in MindSpore (benchmark baseline)."""

    def __init__(self, d_in=16, d_hidden=32, d_out=8):
        super().__init__()
        self.fc1 = nn.Dense(d_in, d_hidden)
        self.act = nn.GELU(approximate=False)
        self.fc2 = nn.Dense(d_hidden, d_out)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TorchAttention(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        scores = scores + torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class TorchFeedForward(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TorchTransformerBlock(torch.nn.Module):
    """The design's TransformerBlock: x + attn(ln1(x)), then x + mlp(ln2(x)) (causal attention)."""

    def __init__(self, dim=32, heads=4, hidden=64):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(dim)
        self.attn = TorchAttention(dim, heads)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.mlp = TorchFeedForward(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class MsAttention(nn.Cell):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Dense(dim, 3 * dim)
        self.proj = nn.Dense(dim, dim)

    def construct(self, x):
        b, t, c = x.shape
        q, k, v = mint.chunk(self.qkv(x), 3, dim=-1)
        q = mint.transpose(mint.reshape(q, (b, t, self.heads, c // self.heads)), 1, 2)
        k = mint.transpose(mint.reshape(k, (b, t, self.heads, c // self.heads)), 1, 2)
        v = mint.transpose(mint.reshape(v, (b, t, self.heads, c // self.heads)), 1, 2)
        scores = mint.div(mint.matmul(q, mint.transpose(k, -2, -1)), math.sqrt(c // self.heads))
        mask = ms.Tensor(np.triu(np.full((t, t), -np.inf, np.float32), 1))
        probs = mint.softmax(mint.add(scores, mask), dim=-1)
        return self.proj(mint.reshape(mint.transpose(mint.matmul(probs, v), 1, 2), (b, t, c)))


class MsFeedForward(nn.Cell):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Dense(dim, hidden)
        self.act = nn.GELU(approximate=False)
        self.fc2 = nn.Dense(hidden, dim)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class MsTransformerBlock(nn.Cell):
    """The same block written by hand in MindSpore, with MindSpore's defaults (LayerNorm epsilon 1e-7)."""

    def __init__(self, dim=32, heads=4, hidden=64):
        super().__init__()
        self.ln1 = nn.LayerNorm((dim,))
        self.attn = MsAttention(dim, heads)
        self.ln2 = nn.LayerNorm((dim,))
        self.mlp = MsFeedForward(dim, hidden)

    def construct(self, x):
        x = mint.add(x, self.attn(self.ln1(x)))
        return mint.add(x, self.mlp(self.ln2(x)))


def gpt2(**overrides):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=101, n_positions=32, use_cache=False,
                  bos_token_id=0, eos_token_id=0)
    config.update(overrides)
    return GPT2LMHeadModel(GPT2Config(**config))


def resnet():
    from transformers import ResNetConfig, ResNetModel

    return ResNetModel(ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                    layer_type="basic"))


def bert():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                vocab_size=101, max_position_embeddings=32))


def assert_same_outputs(cell, torch_module, *inputs, tol=TOL, **kwargs):
    """The Cell's outputs equal torch's within `tol` relative (torch in no_grad; both on the same inputs)."""
    with torch.no_grad():
        want = torch_outputs(torch_module(*inputs, **kwargs))
    got = cell_outputs(cell(*[to_mindspore(x) for x in list(inputs) + list(kwargs.values())]))
    error = relative_error(got, want)
    assert error <= tol, f"max relative error {error:.3g} > {tol}"
    return error


def assert_same_input_gradient(cell, torch_module, x, tol=TOL):
    """The gradient of the summed output with respect to the input `x`, the Cell's against torch's, within
    `tol` relative; returns the error."""
    import mindspore as ms

    x = x.detach().requires_grad_(True)
    torch_module(x).sum().backward()
    grad = ms.grad(lambda v: cell(v).sum())(to_mindspore(x.detach()))
    error = relative_error([grad.asnumpy()], [x.grad.numpy()])
    assert error <= tol, f"input gradient: max relative error {error:.3g} > {tol}"
    return error

