"""Train a small mixture-of-experts model expert parallel and check it against one device.

A token-classification model: embedding -> MoE (8 SwiGLU experts, top-2, a DeepSeek-V3 shared
expert) -> LM head, loss = cross-entropy + the router's load-balancing and z-loss. The strategy
splits the experts over an "expert" mesh axis (data 2 x expert 2 x tensor 2 in simulation: the
experts' feed-forward dimension and the shared expert over "tensor"). After two steps the
experts are re-placed from the routing statistics (`rebalance_experts`: 4 extra replicas of the
hottest experts), which changes which device computes what but not the numbers.

    .venv/bin/python examples/moe_training.py [--steps N]          # simulation: 8 virtual devices
    MS_HYPER_MODE=distributed .venv/bin/mindspore-hyper msrun --worker_num=2 --local_worker_num=2 \\
        --master_port=8128 --log_dir=msrun_log --join=True examples/moe_training.py
                                                                   # 2 processes: expert 2
"""
import argparse
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout, auto_parallelize  # noqa: E402
from mindspore_hyper.moe import MoE  # noqa: E402
from mindspore_hyper.moe.eplb import rebalance_experts  # noqa: E402
from mindspore_hyper.moe.expert_placement import ExpertPlacement, apply_placement  # noqa: E402

VOCAB, HIDDEN = 64, 32


class MoEClassifier(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.moe = MoE(HIDDEN, 48, num_experts=8, top_k=2, aux_loss_coef=0.01, z_loss_coef=1e-3, shared_ffn_hidden=16)
        self.head = nn.Dense(HIDDEN, VOCAB)
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, ids, labels):
        h = self.embed(ids)
        y, aux = self.moe(h)
        logits = self.head(h + y)
        return self.loss(logits.reshape(-1, VOCAB), labels.reshape(-1)) + aux


def strategy(devices: int):
    if devices == 8:
        mesh = Layout((2, 2, 2), ("data", "expert", "tensor"))
        s = mesh(tensor_map=())
        s.override("moe.experts.w_gate", "expert", None, "tensor").override("moe.experts.w_up", "expert", None, "tensor")
        s.override("moe.experts.w_down", "expert", "tensor", None)
        s.override("moe.shared.gate.*", "tensor").override("moe.shared.up.*", "tensor")
        return s.override("moe.shared.down.weight", None, "tensor")
    return Layout((devices,), ("expert",))(tensor_map=()).override("moe.experts.*", "expert")


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--steps", type=int, default=5, help="training steps, at least 3 (the experts are re-placed "
                      "before the third; default 5)")
    steps = args.parse_args().steps
    if steps < 3:
        raise SystemExit(f"--steps must be at least 3 (the re-placement happens after step 2), got {steps}")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(1)
    mode = mh.get_context("mode")
    devices = int(os.environ.get("MS_WORKER_NUM", "2")) if mode == "distributed" else 8
    if mode == "simulation":
        mh.set_context(device_num=devices)
    reference, model = MoEClassifier(), MoEClassifier()
    for p, q in zip(reference.get_parameters(), model.get_parameters()):
        q.set_data(p.data.copy())
    rng = np.random.default_rng(1)
    batches = [(Tensor(rng.integers(0, VOCAB, (8, 8)).astype(np.int32)),
                Tensor(rng.integers(0, VOCAB, (8, 8)).astype(np.int32))) for _ in range(steps)]

    parallel = auto_parallelize(model, strategy(devices))
    optimizer = nn.Adam(parallel.optimizer_parameters(), learning_rate=1e-2)
    ref_opt = nn.Adam(reference.trainable_params(), learning_rate=1e-2)
    ref_step = ms.value_and_grad(reference, None, ref_opt.parameters)
    print(f"mode {mode}, {devices} devices, this process holds {list(parallel.local_ranks)}")
    ok = True
    for step, (ids, labels) in enumerate(batches):
        if step == 2:  # re-place the experts from what the router did
            counts = model.moe.last_expert_counts
            members = 2 if devices == 8 else devices  # devices along the expert axis
            phy2log, _, logcnt = rebalance_experts(counts[None, :], 8 + 2 * members, 1, 1, members)
            apply_placement(model.moe, ExpertPlacement.from_eplb(phy2log))
            print(f"  expert copies per expert {counts.tolist()} -> replicas {logcnt[0].tolist()}")
        loss = float(parallel.train_step(optimizer, ids, labels).asnumpy())
        ref_loss, grads = ref_step(ids, labels)
        ref_opt(grads)
        ref_loss = float(ref_loss.asnumpy())
        print(f"step {step}: loss {loss:.6f} (one device {ref_loss:.6f})")
        ok &= abs(loss - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss))
    if ok:
        print(f"OK: {steps} steps match single-device training")
    else:
        print("MISMATCH against single-device training")
        sys.exit(1)


if __name__ == "__main__":
    main()
