"""Subprocess of test_softmax_backward_cache.py: one fresh process per case (MindSpore's cache is per process).

poison: a Softmax backward over an axis of size 1 first (MindSpore 2.10 then caches a wrong one for every later
    rank-5 dim=-1 softmax), then an attention Cell simulated on 4 devices (auto_parallelize repairs the cache).
clean: the guard first, then the same size-1 softmax, then the attention Cell on one device.
Writes OUT.npz (the attention Cell's loss and gradients) and OUT.json (the softmax error before the guard, the
error after, the warnings).
Usage: softmax_cache_case.py poison|clean OUT
"""
import json
import sys
import warnings

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper.softmax_backward_cache import ensure_softmax_backward  # noqa: E402

HEADS, WIDTH, BATCH, LENGTH = 2, 8, 4, 6
# the simulation runs the attention's 4-D softmax on its shards stacked along one more leading axis: 5-D, dim=-1
SIZE_ONE = (2, 2, 1, 3, 1)


class Attention(nn.Cell):
    """Self-attention over (batch, heads, length, length) scores, softmax over the last dim (-1)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Dense(WIDTH, WIDTH) for _ in range(3))

    def construct(self, x):
        b, t, _ = x.shape

        def heads(y):
            return y.reshape(b, t, HEADS, WIDTH // HEADS).transpose(0, 2, 1, 3)
        scores = ops.matmul(heads(self.q(x)), heads(self.k(x)).transpose(0, 1, 3, 2)) / 2.0
        probs = ops.softmax(scores, axis=-1)
        return ops.matmul(probs, heads(self.v(x))).transpose(0, 2, 1, 3).reshape(b, t, WIDTH)


def softmax_error(shape=(2, 3, 4, 5, 2)):
    """max |MindSpore's softmax gradient - numpy's| for a rank-5 dim=-1 softmax."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    g = ms.grad(lambda t: (ops.softmax(t, axis=-1) * Tensor(w)).sum())(Tensor(x)).asnumpy()
    y = np.exp(x - x.max(-1, keepdims=True))
    y /= y.sum(-1, keepdims=True)
    return float(np.abs(g - y * (w - (w * y).sum(-1, keepdims=True))).max())


def size_one_softmax_gradient():
    """The gradient of a softmax over an axis of length 1 (exactly zero): the case MindSpore caches wrongly."""
    x = Tensor(np.arange(12, dtype=np.float32).reshape(SIZE_ONE))
    return float(np.abs(ms.grad(lambda t: (ops.softmax(t, axis=-1) * 3.0).sum())(x).asnumpy()).max())


def main():
    case, out = sys.argv[1], sys.argv[2]
    record = {}
    ms.set_seed(0)
    model = Attention()
    x = Tensor(np.random.default_rng(0).standard_normal((BATCH, LENGTH, WIDTH)).astype(np.float32))
    params = model.trainable_params()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if case == "clean":
            ensure_softmax_backward()
            record["size_one_gradient"] = size_one_softmax_gradient()
            run = model
        else:
            record["size_one_gradient"] = size_one_softmax_gradient()
            record["error_before"] = softmax_error()
            mh.set_context(mode="simulation", device_num=4)
            run = mh.auto_parallelize(model, {"parallel_config": {"device_matrix": [4], "alias_names": ["data"]}})
    record["warnings"] = [str(w.message) for w in caught if "Softmax backward" in str(w.message)]
    record["error_after"] = softmax_error()
    loss, grads = ms.value_and_grad(lambda t: (run(t) ** 2).sum(), None, params)(x)
    np.savez(out + ".npz", loss=loss.asnumpy(), **{p.name: g.asnumpy() for p, g in zip(params, grads)})
    with open(out + ".json", "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
