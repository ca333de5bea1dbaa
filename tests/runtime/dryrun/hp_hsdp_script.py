"""hsdp training steps on plain batches (the same on every simulated rank, so the summed gradient is
scaled by the group size), a float16 model reduced in float32 and a float32 one, with an Adam step
each: what `mindspore-hyper run` and `mindspore-hyper dryrun` both run."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops
from hyper_parallel import hsdp, init_device_mesh, parallelize_value_and_grad


class Block(nn.Cell):
    def __init__(self, dtype):
        super().__init__()
        self.up = nn.Dense(16, 32, dtype=dtype)
        self.down = nn.Dense(32, 16, dtype=dtype)

    def construct(self, x):
        return self.down(ops.tanh(self.up(x)))


ms.set_context(mode=ms.PYNATIVE_MODE)
init_device_mesh("npu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
for dtype, reduce_dtype in ((ms.float16, ms.float32), (ms.float32, None)):
    model = hsdp(Block(dtype), shard_size=2, threshold=0, reduce_dtype=reduce_dtype)
    optimizer = nn.Adam(model.trainable_params(), 1e-3)
    grad_fn = parallelize_value_and_grad(lambda x: (model(x) ** 2).mean(), optimizer.parameters)
    loss, grads = grad_fn(Tensor(np.ones((8, 16)), dtype))
    optimizer(grads)
