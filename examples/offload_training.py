"""HyperOffload: train a model whose parameters are 4x the device memory budget.

Parameters, Adam states and gradients of the 32 hidden layers live in the tiered block store
(device tier = `device_memory`, host DRAM pool = `host_memory`, the rest on disk under
`offload_dir`); each layer's blocks are prefetched to the device tier just before it runs and
released after. The losses are checked against ordinary in-memory training.

On CPU the "device" tier is a budgeted arena in host memory. On Ascend the same code runs with
`mindspore.set_context(device_target="Ascend")`; the device tier then stands for HBM (this path
was not run here).
"""
import tempfile

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

import mindspore_hyper as mh
from mindspore_hyper.offload import OffloadPolicy, hyper_offload

LAYERS, DIM, STEPS = 32, 512, 5  # 32 x Dense(512, 512): 32 MiB of offloaded parameters
MB = 1 << 20


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(DIM, DIM) for _ in range(LAYERS)])
        self.head = nn.Dense(DIM, 1)

    def construct(self, x):
        for layer in self.layers:
            x = ops.tanh(layer(x))
        return self.head(x)


def train_resident(model, x, y):
    opt = nn.Adam(model.trainable_params(), learning_rate=1e-3)
    step = ms.value_and_grad(lambda a, b: ops.reduce_mean((model(a) - b) ** 2), None, model.trainable_params())
    losses = []
    for _ in range(STEPS):
        loss, grads = step(x, y)
        opt(grads)
        losses.append(float(loss.asnumpy()))
    return losses


def main():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((32, DIM)).astype(np.float32))
    y = Tensor(rng.standard_normal((32, 1)).astype(np.float32))

    reference, model = Net(), Net()
    for p, q in zip(reference.get_parameters(), model.get_parameters()):
        q.set_data(p.data.copy())
    param_bytes = sum(p.asnumpy().nbytes for p in model.layers.get_parameters())
    with tempfile.TemporaryDirectory() as offload_dir:
        mh.set_context(hyper_offload=True, cache_block_size="1MB", device_memory=8 * MB,  # 1/4 of the parameters
                       host_memory=16 * MB, prefetch_depth=4, offload_dir=offload_dir)
        off = hyper_offload(model, OffloadPolicy(cells=["layers.*"]),
                            optimizer=lambda params: nn.Adam(params, learning_rate=1e-3))
        step = off.train_step(lambda a, b: ops.reduce_mean((model(a) - b) ** 2))
        losses = [float(step(x, y).asnumpy()) for _ in range(STEPS)]
        stats = off.stats()
        off.remove()
        off.store.close()
    expected = train_resident(reference, x, y)

    print(f"offloaded parameters: {param_bytes / MB:.1f} MiB = {param_bytes / mh.get_context('device_memory'):.1f}x "
          f"the device tier budget ({mh.get_context('device_memory') / MB:.0f} MiB); host pool "
          f"{mh.get_context('host_memory') / MB:.0f} MiB; the rest on disk")
    print("step  resident   offloaded")
    for i, (a, b) in enumerate(zip(expected, losses)):
        print(f"{i:4d}  {a:.6f}  {b:.6f}")
    moved = {k: f"{v / MB:.1f} MiB" for k, v in stats["bytes_moved"].items() if v}
    print(f"device tier peak {stats['device']['peak_bytes'] / MB:.1f} MiB (budget "
          f"{stats['device']['capacity_blocks']} blocks); moved per run: {moved}")
    print(f"prefetch: {dict((k, stats['prefetch'][k]) for k in ('hits', 'late', 'misses'))}")
    worst = max(abs(a - b) / abs(a) for a, b in zip(expected, losses))
    if worst > 1e-5:
        raise SystemExit(f"offloaded losses differ from resident training (relative {worst:.2e})")
    print(f"OK: offloaded training matches resident training (worst relative difference {worst:.1e})")


if __name__ == "__main__":
    main()
