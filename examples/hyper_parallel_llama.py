"""A Llama-style model made tensor-parallel with the HyperParallel API, checked against one device.

Written the way upstream's HyperParallel (and torch) tensor parallelism is written: a device mesh,
`parallelize_module` with Colwise/Rowwise styles, attention computed on each device's heads, an
ordinary MindSpore optimizer and `value_and_grad`. Run it unchanged:

    mindspore-hyper run --devices 4 examples/hyper_parallel_llama.py          # simulation, 4 devices
    mindspore-hyper run --processes 4 examples/hyper_parallel_llama.py        # msrun, 4 processes

Each run trains the parallel model and a single-device copy from the same initial weights on the
same batches and stops with an error if their losses or weights differ beyond float32 rounding.
"""
import argparse

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from hyper_parallel import init_device_mesh, parallelize_module
from hyper_parallel.core.dtensor.placement_types import Replicate
from hyper_parallel.core.tensor_parallel import ColwiseParallel, RowwiseParallel


class RMSNorm(nn.Cell):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = ms.Parameter(ops.ones(dim, ms.float32), name="weight")
        self.eps = eps

    def construct(self, x):
        return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + self.eps) * self.weight


class Attention(nn.Cell):
    def __init__(self, dim: int, heads: int, tp: int = 1):
        super().__init__()
        self.local_heads, self.head_dim = heads // tp, dim // heads  # each device's heads
        self.wq, self.wk, self.wv = (nn.Dense(dim, dim, has_bias=False) for _ in range(3))
        self.wo = nn.Dense(dim, dim, has_bias=False)

    def construct(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).reshape(b, s, self.local_heads, self.head_dim).transpose(0, 2, 1, 3)
                   for w in (self.wq, self.wk, self.wv))
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) / float(np.sqrt(self.head_dim))
        causal = Tensor(np.triu(np.full((s, s), -1e9, np.float32), 1))
        out = ops.matmul(ops.softmax(scores + causal, -1), v)
        return self.wo(out.transpose(0, 2, 1, 3).reshape(b, s, self.local_heads * self.head_dim))


class FeedForward(nn.Cell):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Dense(dim, hidden, has_bias=False), nn.Dense(dim, hidden, has_bias=False)
        self.w2 = nn.Dense(hidden, dim, has_bias=False)

    def construct(self, x):
        return self.w2(ops.silu(self.w1(x)) * self.w3(x))


class Block(nn.Cell):
    def __init__(self, dim, heads, hidden, tp=1):
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)
        self.attention, self.feed_forward = Attention(dim, heads, tp), FeedForward(dim, hidden)

    def construct(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Cell):
    def __init__(self, vocab=64, dim=32, heads=4, hidden=64, layers=2, tp=1):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.CellList([Block(dim, heads, hidden, tp) for _ in range(layers)])
        self.norm, self.output = RMSNorm(dim), nn.Dense(dim, vocab, has_bias=False)

    def construct(self, ids, labels):
        h = self.tok_embeddings(ids)
        for layer in self.layers:
            h = layer(h)
        logits = self.output(self.norm(h))
        return ops.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


PLAN = {
    "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
    "layers.*.attention.wq": ColwiseParallel(), "layers.*.attention.wk": ColwiseParallel(),
    "layers.*.attention.wv": ColwiseParallel(), "layers.*.attention.wo": RowwiseParallel(),
    "layers.*.feed_forward.w1": ColwiseParallel(), "layers.*.feed_forward.w3": ColwiseParallel(),
    "layers.*.feed_forward.w2": RowwiseParallel(),
    "output": ColwiseParallel(output_layouts=Replicate()),
}


def train(model, batches, lr):
    optimizer = nn.Adam(model.trainable_params(), learning_rate=lr)
    grad_fn = ms.value_and_grad(model, None, optimizer.parameters)
    losses = []
    for ids, labels in batches:
        loss, grads = grad_fn(ids, labels)
        optimizer(grads)
        losses.append(float(loss))
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, default=4, help="tensor-parallel size (the mesh; default 4)")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    ms.set_seed(0)
    model = Llama(tp=args.tp)
    reference = Llama(tp=1)
    for (_, p), (_, r) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        r.set_data(Tensor(p.asnumpy()))  # a copy: set_data of the Parameter itself would share storage
    mesh = init_device_mesh("npu", (args.tp,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, PLAN)
    rng = np.random.RandomState(0)
    batches = [(Tensor(rng.randint(0, 64, (2, 8)).astype(np.int32)), Tensor(rng.randint(0, 64, (2, 8)).astype(np.int32)))
               for _ in range(args.steps)]
    parallel_losses, reference_losses = train(model, batches, 1e-2), train(reference, batches, 1e-2)
    print("parallel  losses:", " ".join(f"{x:.6f}" for x in parallel_losses))
    print("reference losses:", " ".join(f"{x:.6f}" for x in reference_losses))
    # float32 rounding differs between the sharded and whole reductions; Adam's first steps move
    # every weight by about lr, so a real error (a missing or doubled gradient) is >> 1e-4.
    np.testing.assert_allclose(parallel_losses, reference_losses, rtol=1e-4, atol=1e-5)
    print(f"OK: tensor-parallel {args.tp} trains like one device over {args.steps} steps")


if __name__ == "__main__":
    main()
