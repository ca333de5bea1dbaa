"""Worker of the MoE-in-pipeline msrun test: MoEChain pipelined over 2 processes (one MoEBlock
per stage, its experts local) for 5 Adam steps per schedule kind, and the same model on one
device accumulating the same microbatches in the same process; writes per rank, per kind, both
losses, evaluation losses and this process's stage parameters next to the reference's to JSON.

Usage (under msrun --worker_num=2): moe_pipeline_msrun_worker.py OUT_DIR KIND [KIND ...]
"""
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout  # noqa: E402
from moe_models import MICROBATCHES, MoEChain, chain_data, copy_weights, one_device_accumulating  # noqa: E402


def run_kind(kind: str) -> dict:
    ms.set_seed(0)
    model, ref = MoEChain(), MoEChain()
    parallel = mh.auto_parallelize(model, Layout((2,), ("pipeline",))(tensor_map=()),
                                   pipeline=dict(schedule=kind, microbatches=MICROBATCHES, layers_per_stage=(2, 3)))
    copy_weights(model, ref)  # after the builder broadcast rank 0's initial values
    data = chain_data()
    opt = nn.Adam(parallel.optimizer_parameters(), learning_rate=1e-2)
    losses = [float(parallel.train_step(opt, x, t).asnumpy()) for x, t in data]
    ref_losses = one_device_accumulating(ref, data)
    x, t = data[0]
    held = {p.name for s in parallel.held_stages() for p in parallel.stage_cells[s].trainable_params()}
    expected = {p.name: p.asnumpy() for p in ref.trainable_params()}
    return {"rank": parallel.world.rank, "losses": losses, "ref_losses": ref_losses,
            "eval_loss": float(parallel(x, t).asnumpy()), "ref_eval_loss": float(ref(x, t).asnumpy()),
            "aux_losses": [a for c in parallel.computations.values() for a in c.aux_losses],
            "params": {p.name: p.asnumpy().tolist() for p in model.trainable_params() if p.name in held},
            "ref_params": {n: v.tolist() for n, v in expected.items() if n in held}}


def main():
    out_dir, kinds = sys.argv[1], sys.argv[2:]
    mh.set_context(mode="distributed", comm_timeout=float(os.environ.get("TEST_COMM_TIMEOUT", "60")))
    results = {kind: run_kind(kind) for kind in kinds}
    rank = results[kinds[0]]["rank"]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
