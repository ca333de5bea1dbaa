"""Quickstart: the seed's HyperShard snippet on a small Transformer, simulated on 8 CPU devices.

    layout = Layout(device_matrix=(2, 2, 2), alias_names=("data", "tensor", "pipeline"))
    strategy = layout(tensor_map=("tensor", None, "pipeline"), optimizer_state="data")
    parallel_model = auto_parallelize(model, strategy)

Runs in simulation mode (the default on CPU): one process holds all 8 virtual devices, every op
runs per shard, and the output is checked against the ordinary single-device model. On Ascend,
`mindspore_hyper.set_context(mode="native")` makes the same `auto_parallelize` call configure
MindSpore's own semi-auto parallel instead (launch with msrun; not run on this CPU machine).
"""
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout, auto_parallelize  # noqa: E402
from models import GPT  # noqa: E402


def main():
    ms.set_seed(0)
    mh.set_context(mode="simulation", device_num=8, device_memory="64GiB")

    layout = Layout(device_matrix=(2, 2, 2), alias_names=("data", "tensor", "pipeline"))
    strategy = layout(tensor_map=("tensor", None, "pipeline"), optimizer_state="data")
    model = GPT(vocab=128, hidden=64, heads=4, layers=2, seq=16)
    parallel_model = auto_parallelize(model, strategy)
    print(parallel_model.table)

    rng = np.random.default_rng(0)
    ids = Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32))
    logits = parallel_model(ids)
    expected = model(ids)  # the same Cell and Parameters, single device
    error = float(np.abs(logits.asnumpy() - expected.asnumpy()).max())
    print()
    print(parallel_model.report())
    print(f"\noutput {tuple(logits.shape)} vs single-device: max abs difference {error:.2e}")
    if error > 1e-4:
        raise SystemExit("simulation output differs from the single-device model")
    print("OK: the simulated 8-device run matches the single-device model")


if __name__ == "__main__":
    main()
