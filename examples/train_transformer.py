"""Train a small GPT for a few steps with data x tensor parallelism (Megatron-style) and ZeRO-1,
and check every step's loss (and the final parameters) against single-device training.

The same script runs in every mode:

    .venv/bin/python examples/train_transformer.py                 # simulation: 8 virtual devices
    MS_HYPER_MODE=distributed .venv/bin/mindspore-hyper msrun --worker_num=4 --local_worker_num=4 \\
        --master_port=8118 --log_dir=msrun_log --join=True examples/train_transformer.py
                                                                   # 4 processes (see msrun_log/worker_*.log)

Megatron-style tensor parallelism is declared with overrides: qkv and fc1 split by output
(column parallel), proj and fc2 by input (row parallel), embedding and LM head by vocabulary.
The mesh is data 2 x tensor (devices / 2); optimizer states are split along "data" (ZeRO-1).
On Ascend, `set_context(mode="native")` hands the same strategy to MindSpore's semi-auto
parallel; that path was not run on this CPU-only machine.
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout, auto_parallelize  # noqa: E402
from models import GPT  # noqa: E402

STEPS = 5


def megatron_strategy(devices: int):
    data = 2 if devices % 2 == 0 and devices > 1 else 1
    layout = Layout((data, devices // data), ("data", "tensor"))
    strategy = layout(tensor_map=(), optimizer_state="data" if data > 1 else None)
    strategy.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
    strategy.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
    strategy.override("embed.*", "tensor").override("head.weight", "tensor")
    return strategy


def main():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(1)
    mode = mh.get_context("mode")
    devices = int(os.environ.get("MS_WORKER_NUM", "8")) if mode == "distributed" else 8
    if mode == "simulation":
        mh.set_context(device_num=devices)
    reference = GPT(vocab=128, hidden=64, heads=4, layers=2, seq=16)
    model = GPT(vocab=128, hidden=64, heads=4, layers=2, seq=16)
    for p, q in zip(reference.get_parameters(), model.get_parameters()):
        q.set_data(p.data.copy())

    rng = np.random.default_rng(1)
    batches = [(Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32)),
                Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32))) for _ in range(STEPS)]
    parallel = auto_parallelize(model, megatron_strategy(devices))
    optimizer = nn.AdamWeightDecay(parallel.optimizer_parameters(), learning_rate=1e-3, weight_decay=0.01)
    par_losses = [float(parallel.train_step(optimizer, ids, labels).asnumpy()) for ids, labels in batches]

    ref_optimizer = nn.AdamWeightDecay(reference.trainable_params(), learning_rate=1e-3, weight_decay=0.01)
    ref_step = ms.value_and_grad(reference, None, ref_optimizer.parameters)
    ref_losses = []
    for ids, labels in batches:
        loss, grads = ref_step(ids, labels)
        ref_optimizer(grads)
        ref_losses.append(float(loss.asnumpy()))

    print(f"mode {mode}, {devices} devices, this process holds {list(parallel.local_ranks)}")
    print("step  single-device   parallel     rel.diff")
    for i, (a, b) in enumerate(zip(ref_losses, par_losses)):
        print(f"{i:4d}  {a:13.6f}  {b:10.6f}  {abs(a - b) / abs(a):9.2e}")
    print()
    print(parallel.report(optimizer))
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref_losses, par_losses))
    if worst > 1e-5:
        raise SystemExit(f"losses differ from single-device training (relative {worst:.2e})")
    print(f"\nOK: {STEPS} steps match single-device training (worst relative loss difference {worst:.1e})")


if __name__ == "__main__":
    main()
