"""Quickstart: the seed's HyperShard snippet on a small GPT where each axis does what its name says.

The design article's snippet (section 3.1, "HyperShard编程模型"), kept as written below:

    layout = Layout(device_matrix=(2, 2, 2), alias_names=("data", "tensor", "pipeline"))
    strategy = layout(tensor_map=("tensor", None, "pipeline"), optimizer_state="data")
    parallel_model = auto_parallelize(model, strategy)

In the article `tensor_map` describes one 4-D tensor (dim 0 split over "tensor", dim 2 over
"pipeline"); applied to a whole model it is a default by dimension position, so on its own it would
split every parameter's first dimension over "tensor" (LayerNorm weights included) and shard
nothing over "pipeline" (no parameter here has a third dimension). This script keeps those lines
and adds what gives each axis its meaning on a GPT of 2 blocks:

- "data" splits the batch (inputs split on dim 0; gradients summed over it; Adam states split
  over it: the snippet's `optimizer_state="data"`, ZeRO-1);
- "tensor" splits the weights Megatron-style: the seed's map makes qkv and fc1 column-parallel and
  the embedding and head vocabulary-parallel; per-name overrides make proj and fc2 row-parallel
  and keep the LayerNorms, the position embedding and the row-parallel biases replicated;
- "pipeline" runs pipeline stages: `pipeline=` cuts the blocks into 2 stages and runs a 1F1B
  schedule over 2 microbatches per step.

It trains 3 Adam steps on 8 simulated devices (one process holds all of them; every op runs per
shard) and checks each step's loss against the same steps of the ordinary model on one device.
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

STEPS, BATCH, SEQ, VOCAB, HIDDEN = 3, 8, 16, 128, 64


def build_model() -> GPT:
    """The GPT (2 blocks), seeded: the parallel run and the reference start from the same weights."""
    ms.set_seed(0)
    return GPT(vocab=VOCAB, hidden=HIDDEN, heads=4, layers=2, seq=SEQ)


def loss_rtol(steps: int) -> np.ndarray:
    """Relative tolerance of each step's loss, parallel against one device, derived from the
    computation (the first-order model of docs/training.md, "Tolerances"): both runs compute the
    same float32 mathematics in another summation order. A float32 reduction of K terms is within
    gamma_K = K u / (1 - K u) of its sum of |terms| (u = 2^-24; Higham, eq. 3.5), K the longest
    reduction of a step: fc2's fan-in 4 x HIDDEN = 256 (longer than the 128 tokens of a weight
    gradient and the 128-word log-sum-exp). Each layer's error passes through the forward product,
    the two backward products and the gradient sum (4 times), and step s's loss follows s - 1
    updates that carry a relative gradient error at most as large (Adam's step is normalised):
    4 s gamma_K. A real error (a wrong shard, a missing gradient sum) moves a loss by O(1e-2)."""
    u, k = 2.0 ** -24, 4 * HIDDEN
    return 4 * np.arange(1, steps + 1) * (k * u / (1 - k * u))


def main():
    mh.set_context(mode="simulation", device_num=8, device_memory="64GiB")
    model = build_model()

    # --- the seed's snippet, as written in the design article -------------------------------------
    layout = Layout(device_matrix=(2, 2, 2), alias_names=("data", "tensor", "pipeline"))
    strategy = layout(tensor_map=("tensor", None, "pipeline"), optimizer_state="data")
    # --- what makes "tensor" Megatron's split on this model ---------------------------------------
    # The seed's default map already splits qkv and fc1 by output (column parallel) and the embedding
    # and head by vocabulary; the overrides (by name pattern, the last match decides) add the rest:
    strategy.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")  # row parallel
    strategy.override("*.proj.bias").override("*.fc2.bias")  # added after the row-parallel sum: replicated
    strategy.override("*ln*").override("pos.*")               # LayerNorms, position embedding: replicated
    # --- the seed's last line, plus what makes "pipeline" run stages -------------------------------
    parallel_model = auto_parallelize(model, strategy, pipeline={"schedule": "1f1b", "microbatches": 2})
    print(parallel_model.table)

    rng = np.random.default_rng(0)
    batches = [tuple(Tensor(rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)) for _ in range(2))
               for _ in range(STEPS)]
    optimizer = nn.Adam(parallel_model.optimizer_parameters(), learning_rate=1e-2)
    losses = [float(parallel_model.train_step(optimizer, ids, labels).asnumpy()) for ids, labels in batches]
    print()
    print(parallel_model.report(optimizer))

    reference = build_model()  # the same steps on one device: MindSpore's own training step
    one_device = nn.TrainOneStepCell(reference, nn.Adam(reference.trainable_params(), learning_rate=1e-2))
    expected = [float(one_device(ids, labels).asnumpy()) for ids, labels in batches]

    rtol = loss_rtol(STEPS)
    print("\nstep  one device   8 devices    rel.diff   derived bound")
    for step, (a, b, r) in enumerate(zip(expected, losses, rtol)):
        print(f"{step:4d}  {a:10.6f}  {b:10.6f}  {abs(a - b) / abs(a):9.2e}  {r:9.2e}")
    if any(abs(a - b) > r * abs(a) for a, b, r in zip(expected, losses, rtol)):
        raise SystemExit("the 8-device training differs from the single-device training beyond the derived bound")
    print(f"OK: {STEPS} steps on data 2 x tensor 2 x pipeline 2 (8 simulated devices) match one device")


if __name__ == "__main__":
    main()
