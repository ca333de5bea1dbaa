"""HyperOffload: train a model whose parameters are 4x the device memory budget.

Parameters, Adam states and gradients of the 32 hidden layers live in the tiered block store
(device tier = `device_memory`, host DRAM pool = `host_memory`, the rest on disk under
`offload_dir`); each layer's blocks are prefetched to the device tier just before it runs and
released after. The losses are checked against ordinary in-memory training.

With `--simulate` the same model runs on 8 simulated devices (data 2 x tensor 4, ZeRO-1): every
virtual device gets its own store, whose device tier (the same `device_memory` budget, now per
device) holds only that device's shards, parameters and the slice of optimizer states and
gradients it updates.

On CPU the "device" tier is a budgeted arena in host memory. On Ascend the same code runs with
`mindspore.set_context(device_target="Ascend")`; the device tier then stands for HBM (this path
was not run here).

usage: python examples/offload_training.py [--simulate] [--steps N] [--layers N]
"""
import argparse
import tempfile

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

import mindspore_hyper as mh
from mindspore_hyper.offload import OffloadPolicy, hyper_offload
from mindspore_hyper.shard import Layout
from mindspore_hyper.runtime.simulation import simulate

DIM = 512  # 32 x Dense(512, 512) by default: 32 MiB of offloaded parameters (--simulate: 1024, 128 MiB, 32 per device)
MB = 1 << 20


class Net(nn.Cell):
    def __init__(self, dim, layers):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(dim, dim) for _ in range(layers)])
        self.head = nn.Dense(dim, 1)

    def construct(self, x):
        for layer in self.layers:
            x = ops.tanh(layer(x))
        return self.head(x)


def train_resident(model, x, y, steps):
    opt = nn.Adam(model.trainable_params(), learning_rate=1e-3)
    step = ms.value_and_grad(lambda a, b: ops.reduce_mean((model(a) - b) ** 2), None, model.trainable_params())
    losses = []
    for _ in range(steps):
        loss, grads = step(x, y)
        opt(grads)
        losses.append(float(loss.asnumpy()))
    return losses


def simulated(model):
    """`model` on 8 simulated devices: hidden layers alternately column- and row-parallel."""
    mh.set_context(device_num=8)
    strategy = Layout((2, 4), ("data", "tensor"))(tensor_map=(), optimizer_state="data")
    for i in range(0, len(model.layers), 2):
        strategy.override(f"layers.{i}.*", "tensor").override(f"layers.{i + 1}.weight", None, "tensor")
    return simulate(model, strategy)


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--simulate", action="store_true", help="run on 8 simulated devices, a store per device")
    args.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    args.add_argument("--layers", type=int, default=32, help="offloaded hidden layers, an even number (default 32; "
                      "below 24 (16 with --simulate) the device tier keeps room for a layer's working set, "
                      "so the parameters are less than 4x it)")
    args = args.parse_args()
    if args.steps < 1:
        raise SystemExit(f"--steps must be at least 1, got {args.steps}")
    if args.layers < 2 or args.layers % 2:
        raise SystemExit(f"--layers must be an even number >= 2 (column/row-parallel pairs), got {args.layers}")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    dim = 2 * DIM if args.simulate else DIM  # the same bytes per device as the single device run
    x = Tensor(rng.standard_normal((32, dim)).astype(np.float32))
    y = Tensor(rng.standard_normal((32, 1)).astype(np.float32))

    reference, model = Net(dim, args.layers), Net(dim, args.layers)
    for p, q in zip(reference.get_parameters(), model.get_parameters()):
        q.set_data(p.data.copy())
    param_bytes = sum(p.asnumpy().nbytes for p in model.layers.get_parameters())
    # Each device keeps 1/4 of its parameter bytes in its device tier, and 1/2 in its host pool;
    # the tier holds at least a layer's working set with room to prefetch: its shards plus the
    # gradients and two Adam states of the slice it updates, 5 layers' shards on one device (6 with
    # room), 4 in simulation (ZeRO-1 halves the states); so fewer than 24 (16) layers get that
    # tier instead of a quarter (a shorter run, whose parameters are less than 4x the tier).
    shard_bytes = param_bytes // 4 if args.simulate else param_bytes  # tensor-parallel over 4
    tier = max(shard_bytes // 4, (4 if args.simulate else 6) * (shard_bytes // args.layers))
    devices = 8 if args.simulate else 1
    with tempfile.TemporaryDirectory() as offload_dir:
        mh.set_context(hyper_offload=True, cache_block_size="1MiB", device_memory=tier,
                       host_memory=devices * shard_bytes // 2, prefetch_depth=4, offload_dir=offload_dir)
        run = simulated(model) if args.simulate else model
        off = hyper_offload(run, OffloadPolicy(cells=["layers.*"]),
                            optimizer=lambda params: nn.Adam(params, learning_rate=1e-3))
        step = off.train_step(lambda a, b: ops.reduce_mean((run(a) - b) ** 2))
        losses = [float(step(x, y).asnumpy()) for _ in range(args.steps)]
        stats = off.stats()
        off.remove()
        off.close()
    expected = train_resident(reference, x, y, args.steps)

    budget = mh.get_context("device_memory")
    print(f"offloaded parameters: {param_bytes / MB:.1f} MiB" + (f" over 8 simulated devices, "
          f"{shard_bytes / MB:.1f} MiB of them per device" if args.simulate else "")
          + f" = {shard_bytes / budget:.1f}x the device tier budget ({budget / MB:.0f} MiB"
          + (" per device" if args.simulate else "") + f"); host pool {mh.get_context('host_memory') / MB:.0f} MiB"
          + (" shared evenly" if args.simulate else "") + "; the rest on disk")
    print("step  resident   offloaded")
    for i, (a, b) in enumerate(zip(expected, losses)):
        print(f"{i:4d}  {a:.6f}  {b:.6f}")
    for rank, s in enumerate(stats.get("devices", [stats])):
        moved = {k: f"{v / MB:.1f} MiB" for k, v in s["bytes_moved"].items() if v}
        where = f"device {rank}: " if args.simulate else ""
        print(f"{where}device tier peak {s['device']['peak_bytes'] / MB:.1f} MiB (budget "
              f"{s['device']['capacity_blocks']} blocks); moved per run: {moved}; prefetch "
              f"{dict((k, s['prefetch'][k]) for k in ('hits', 'late', 'misses'))}")
    worst = max(abs(a - b) / abs(a) for a, b in zip(expected, losses))
    if worst > 1e-5:
        raise SystemExit(f"offloaded losses differ from resident training (relative {worst:.2e})")
    print(f"OK: offloaded training matches resident training (worst relative difference {worst:.1e})")


if __name__ == "__main__":
    main()
