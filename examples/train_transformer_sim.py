"""Train a small GPT for a few steps on 8 simulated devices (data 2 x tensor 4, ZeRO-1 optimizer
sharding along 'data') and check every step's loss against single-device training.

Megatron-style tensor parallelism is declared with overrides: qkv and fc1 split by output
(column parallel), proj and fc2 by input (row parallel), embedding and LM head by vocabulary.
On Ascend, `set_context(mode="native")` hands the same strategy to MindSpore's semi-auto
parallel (launch under msrun); that path was not run on this CPU-only machine.
"""
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


def megatron_strategy():
    layout = Layout((2, 4), ("data", "tensor"))
    strategy = layout(tensor_map=(), optimizer_state="data")
    strategy.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
    strategy.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
    strategy.override("embed.*", "tensor").override("head.weight", "tensor")
    return strategy


def train(net, params, batches):
    optimizer = nn.AdamWeightDecay(params, learning_rate=1e-3, weight_decay=0.01)
    step = ms.value_and_grad(net, None, optimizer.parameters)
    losses = []
    for ids, labels in batches:
        loss, grads = step(ids, labels)
        optimizer(grads)
        losses.append(float(loss.asnumpy()))
    return losses, optimizer


def main():
    ms.set_seed(1)
    mh.set_context(mode="simulation", device_num=8)
    reference = GPT(vocab=128, hidden=64, heads=4, layers=2, seq=16)
    model = GPT(vocab=128, hidden=64, heads=4, layers=2, seq=16)
    for p, q in zip(reference.get_parameters(), model.get_parameters()):
        q.set_data(p.data.copy())

    rng = np.random.default_rng(1)
    batches = [(Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32)),
                Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32))) for _ in range(STEPS)]
    parallel = auto_parallelize(model, megatron_strategy())
    ref_losses, _ = train(reference, reference.trainable_params(), batches)
    par_losses, optimizer = train(parallel, model.trainable_params(), batches)

    print("step  single-device  simulated(8)   rel.diff")
    for i, (a, b) in enumerate(zip(ref_losses, par_losses)):
        print(f"{i:4d}  {a:13.6f}  {b:12.6f}  {abs(a - b) / abs(a):9.2e}")
    print()
    print(parallel.report(optimizer))
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref_losses, par_losses))
    if worst > 1e-5:
        raise SystemExit(f"losses differ from single-device training (relative {worst:.2e})")
    print(f"\nOK: {STEPS} steps match single-device training (worst relative loss difference {worst:.1e})")


if __name__ == "__main__":
    main()
