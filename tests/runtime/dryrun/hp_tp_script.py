"""A HyperParallel-API training step (parallelize_module, value_and_grad, an optimizer step)
that reads no value: what `mindspore-hyper run` and `mindspore-hyper dryrun` both run."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops
from hyper_parallel import init_device_mesh
from hyper_parallel.core.tensor_parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up = nn.Dense(16, 64)
        self.down = nn.Dense(64, 16)

    def construct(self, x):
        return self.down(ops.relu(self.up(x)))


ms.set_context(mode=ms.PYNATIVE_MODE)
model = MLP()
mesh = init_device_mesh("npu", (4,), mesh_dim_names=("tp",))
parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
optimizer = nn.Adam(model.trainable_params(), 1e-3)


def loss_fn(x):
    return (model(x) ** 2).mean()


grad_fn = ms.value_and_grad(loss_fn, None, optimizer.parameters)
loss, grads = grad_fn(Tensor(np.ones((8, 16), np.float32)))
optimizer(grads)
