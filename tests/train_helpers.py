"""Shared by the training-option tests (clipping, accumulation, loss scaling): a MindSpore nn layer
model with its loss, its strategies, and the single-device reference step."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

import mindspore_hyper as mh
from mindspore_hyper import Layout

BATCH, D_IN, D_HIDDEN, D_OUT = 16, 16, 32, 4


class DenseNorm(nn.Cell):
    """nn.Dense -> nn.LayerNorm -> tanh -> nn.Dense, mean squared error against `y`."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(D_IN, D_HIDDEN)
        self.norm = nn.LayerNorm((D_HIDDEN,))
        self.fc2 = nn.Dense(D_HIDDEN, D_OUT)
        self.loss = nn.MSELoss()

    def construct(self, x, y):
        return self.loss(self.fc2(ops.tanh(self.norm(self.fc1(x)))), y)


def batch(seed=0, size=BATCH, scale=1.0):
    rng = np.random.default_rng(seed)
    return (Tensor((scale * rng.standard_normal((size, D_IN))).astype(np.float32)),
            Tensor(rng.standard_normal((size, D_OUT)).astype(np.float32)))


def strategy(kind: str):
    """'dp' data over 4, 'dxt' data x tensor (Megatron column/row parallel), 'zero' the same with
    ZeRO-1 optimizer states over data."""
    if kind == "dp":
        return Layout((4,), ("data",))(tensor_map=())
    s = Layout((2, 2), ("data", "tensor"))(tensor_map=(), optimizer_state="data" if kind == "zero" else None)
    return s.override("fc1.*", "tensor").override("fc2.weight", None, "tensor")


def twins():
    """Two DenseNorm models with the same weights: the single-device reference and the one to parallelize."""
    ms.set_seed(0)
    ref, net = DenseNorm(), DenseNorm()
    for p, q in zip(ref.get_parameters(), net.get_parameters()):
        q.set_data(p.data.copy())
    return ref, net


def parallel(net, kind: str):
    s = strategy(kind)
    mh.set_context(mode="simulation", device_num=s.mesh.size)
    return mh.auto_parallelize(net, s)


def reference_grads(ref, *inputs):
    """(loss, gradients as Tensors) of the single-device model on the whole batch."""
    loss, grads = ms.value_and_grad(ref, None, ref.trainable_params())(*inputs)
    return float(loss), list(grads)


def exact_norm(grads) -> float:
    return float(np.sqrt(sum(np.sum(np.asarray(g.asnumpy(), np.float64) ** 2) for g in grads)))
