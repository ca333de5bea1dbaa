"""Worker of the context-parallel msrun test: the example GPT (causal) trained with ring and/or
Ulysses attention over a data x cp mesh of processes, and the same GPT on one device in the same
process; writes losses and the largest relative parameter error per rank to JSON.

Usage (under msrun): cp_worker.py OUT_DIR DATA CP METHOD [METHOD ...]
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout, auto_parallelize  # noqa: E402
from models import GPT  # noqa: E402

STEPS = 5


def main(out_dir: str, data: int, cp: int, method: str) -> None:
    ms.set_seed(1)
    ref = GPT(vocab=32, hidden=16, heads=4, layers=1, seq=16)
    model = GPT(vocab=32, hidden=16, heads=4, layers=1, seq=16)
    for p, q in zip(ref.get_parameters(), model.get_parameters()):
        q.set_data(p.data.copy())
    strategy = Layout((data, cp), ("data", "cp"))(tensor_map=(), context_parallel="cp", context_method=method)
    par = auto_parallelize(model, strategy)
    optimizer = nn.Momentum(par.optimizer_parameters(), 0.05, 0.9)
    ref_opt = nn.Momentum(ref.trainable_params(), 0.05, 0.9)
    ref_step = ms.value_and_grad(ref, None, ref_opt.parameters)
    rng = np.random.default_rng(1)
    out = {"rank": par.local_ranks[0], "losses": [], "ref_losses": []}
    for _ in range(STEPS):
        ids = Tensor(rng.integers(0, 32, (data, 16)).astype(np.int32))
        labels = Tensor(rng.integers(0, 32, (data, 16)).astype(np.int32))
        out["losses"].append(float(par.train_step(optimizer, ids, labels).asnumpy()))
        ref_loss, ref_grads = ref_step(ids, labels)
        ref_opt(ref_grads)
        out["ref_losses"].append(float(ref_loss.asnumpy()))
    out["param_error"] = max(
        float(np.abs(p.asnumpy() - r.asnumpy()).max() / max(np.abs(r.asnumpy()).max(), 1e-30))
        for p, r in zip(model.trainable_params(), ref.trainable_params()))
    report = par.report(optimizer)
    out["comm"] = {k: v for k, v in report.comm.items()}
    out["comm_backward"] = {k: v for k, v in report.comm_backward.items()}
    with open(os.path.join(out_dir, f"{method}-rank{out['rank']}.json"), "w") as f:
        json.dump(out, f, default=str)


if __name__ == "__main__":
    mh.set_context(mode="distributed", comm_timeout=60.0)
    for method in sys.argv[4:]:
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), method)
