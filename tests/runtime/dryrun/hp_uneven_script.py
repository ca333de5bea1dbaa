"""A HyperParallel-API training step on pieces the 4 devices do not divide (torch.chunk: 7 rows
2, 2, 2, 1; 3 rows 1, 1, 1, 0, the last piece empty): fully_shard of a 7-row and a 3-row weight,
a batch of 7 rows split over the devices, value_and_grad and an Adam step; then the padded
redistributions (Shard(0) -> Shard(1) all-to-all, Partial -> Shard(0) reduce-scatter, gathers).
It reads no value: what `mindspore-hyper run` and `mindspore-hyper dryrun` both run."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops
from hyper_parallel import DTensor, distribute_tensor, fully_shard, init_device_mesh
from hyper_parallel.core.dtensor.placement_types import Partial, Replicate, Shard


class Small(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Dense(5, 7), nn.Dense(7, 3)

    def construct(self, x):
        return self.down(ops.tanh(self.up(x)))


ms.set_context(mode=ms.PYNATIVE_MODE)
model = Small()
mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
fully_shard(model, mesh=mesh)
optimizer = nn.Adam(model.trainable_params(), 1e-3)


def loss_fn(x):
    return (model(x) ** 2).sum()


grad_fn = ms.value_and_grad(loss_fn, None, optimizer.parameters)
batch = distribute_tensor(Tensor(np.ones((7, 5), np.float32)), mesh, [Shard(0)])  # 2, 2, 2, 1 rows
loss, grads = grad_fn(batch)
optimizer(grads)

rows = distribute_tensor(Tensor(np.ones((7, 3), np.float32)), mesh, [Shard(0)])
columns = ops.softmax(rows, axis=1).redistribute(mesh, [Shard(1)]) * 2.0  # 3 columns: 1, 1, 1, 0
total = columns.redistribute(mesh, [Replicate()]).sum()
summed = DTensor.from_local(Tensor(np.ones((7, 3), np.float32)), mesh, [Partial("sum")]).redistribute(mesh, [Shard(0)])
gathered = ops.cumsum(summed, 1).redistribute(mesh, [Replicate()])
