"""msrun worker: the multimodal model with its groups on 4 processes (text 0-1, vision 2,
fusion 3), 3 Adam steps, then a fresh pair 3 momentum steps with global-norm clipping and loss
scaling, then 2 Adam steps through torch-style `loss.backward()` and `optimizer_step` against
train_step's and one device's; writes rank<N>.json with losses, norms, this group's gradients and
parameters next to single-device runs done in the same process. `fail@R`: rank R fails after one training
step: it prints the error and leaves with status 0 without closing anything, as a crashed process
would (msrun kills every worker as soon as one exits non-zero, which would race the others' own
report); the others must notice the dead peer by themselves and fail naming it.

Usage (under msrun): mpmd_worker.py OUT_DIR [train|fail@R|rlhf ...], one after another in the same
processes (default train); "rlhf" runs rlhf_worker.py's job, writing to OUT_DIR/rlhf/ (the tests
share one 4-process launch: conftest.py)."""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..")]
import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402

import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper.strategy.config import load_parallel_config  # noqa: E402
from mpmd_models import Multimodal, make_pair, multimodal_batch, train_reference  # noqa: E402
from tolerances import reduction_length  # noqa: E402

CONFIG = {"parallel_config": {"device_num": 4},
          "process_groups": {"text_encoder": {"ranks": [0, 1], "batch_size": 32, "hardware": "CPU"},
                             "vision_encoder": {"ranks": 2, "hardware": "CPU"},
                             "fusion_layer": {"ranks": 3, "hardware": "CPU"}},
          "scheduler": "static"}


def main(out_dir, mode="train"):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(hyper_mpmd=True, comm_timeout=float(os.environ.get("TEST_COMM_TIMEOUT", "60")))
    rank = int(os.environ.get("RANK_ID", "0"))
    net, ref = make_pair(lambda: Multimodal(text_layers=2))
    model = mh.auto_parallelize(net, load_parallel_config(CONFIG), mode="distributed")
    batches = [multimodal_batch(seed=s) for s in range(3)]
    if mode.startswith("fail@"):
        victim = int(mode.split("@")[1])
        model.train_step(ms.nn.Adam(model.optimizer_parameters(), learning_rate=1e-2), *batches[0])
        if rank == victim:
            print(f"rank {rank} fails on purpose", file=sys.stderr, flush=True)
            os._exit(0)  # no clean-up, no non-zero status for msrun to act on
        start = time.time()
        try:
            model(*batches[1])
        except Exception as exc:  # noqa: BLE001 - the error is the result
            with open(os.path.join(out_dir, f"fail_rank{rank}.json"), "w") as f:
                json.dump({"error": type(exc).__name__, "message": str(exc), "seconds": time.time() - start}, f)
            raise
        return
    opt = ms.nn.Adam(model.optimizer_parameters(), learning_rate=1e-2)
    losses, first = [], None
    for batch in batches:
        losses.append(float(model.train_step(opt, *batch)))
        if first is None:
            first = dict(model.last_gradients)
    mine = {p.name: p.asnumpy() for p in model.optimizer_parameters()}
    report = model.report(opt)  # this process's rank: its group's Cells
    ref_losses, ref_grads, ref_params = train_reference(ref, batches)
    result = {
        "rank": rank, "losses": losses, "ref_losses": ref_losses,
        "groups": {n: list(p.ranks) for n, p in model.placements().items()},
        "members": [n for n, r in model.runners.items() if r.member],
        "params": sorted(mine),
        "grad_error": {n: float(np.abs(first[n] - ref_grads[n]).max()) for n in first},
        "param_error": {n: float(np.abs(mine[n] - ref_params[n]).max()) for n in mine},
        "events": [[n, *e] for n, r in model.runners.items() for e in r.events],  # group, kind, cell, start, end
        "report_ranks": sorted(report.memory), "report_parameters": report.memory[rank]["parameters"],
        "param_bytes": sum(a.nbytes for a in mine.values()), "report_groups": sorted(report.mpmd.groups),
        "norm_rows": [[row, report.comm_causes["backward"]["AllReduce"][axis]]  # over the job's mesh: no "@group"
                      for axis, row in report.comm_backward.get("AllReduce", {}).items() if "@" not in axis],
    }
    result.update(clipped_training())
    result.update(backward_training())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def clipped_training(steps=3, lr=0.1, momentum=0.9, max_norm=0.05, scale=2.0 ** 10):
    """A fresh model pair trained `steps` momentum steps with max_grad_norm and a static loss scale
    (2**10: exact in float32, so the unscaled gradients are the unscaled run's), against one device
    with ops.clip_by_global_norm: each step's loss and global norm, and this group's parameters."""
    net, ref = make_pair(lambda: Multimodal(text_layers=2))
    model = mh.auto_parallelize(net, load_parallel_config(CONFIG), mode="distributed")
    batches = [multimodal_batch(seed=10 + s) for s in range(steps)]
    opt = ms.nn.Momentum(model.optimizer_parameters(), lr, momentum)
    losses, norms = [], []
    for batch in batches:
        losses.append(float(model.train_step(opt, *batch, max_grad_norm=max_norm, loss_scale=scale)))
        norms.append(model.last_grad_norm)
    ref_opt = ms.nn.Momentum(ref.trainable_params(), lr, momentum)
    grad_fn = ms.value_and_grad(ref, None, ref.trainable_params())
    ref_losses, ref_norms = [], []
    start = {p.name: p.asnumpy().copy() for p in ref.trainable_params()}
    for batch in batches:
        loss, grads = grad_fn(*batch)
        ref_losses.append(float(loss))
        ref_norms.append(float(np.sqrt(sum(np.sum(g.asnumpy().astype(np.float64) ** 2) for g in grads))))
        ref_opt(ms.ops.clip_by_global_norm(grads, max_norm))
    want = {p.name: p.asnumpy() for p in ref.trainable_params()}
    mine = {p.name: p.asnumpy() for p in model.optimizer_parameters()}
    return {"clip_losses": losses, "clip_ref_losses": ref_losses, "clip_norms": norms, "clip_ref_norms": ref_norms,
            "clip_max_norm": max_norm, "clip_skipped": model.last_step_skipped,
            "clip_param_error": {n: float(np.linalg.norm(mine[n] - want[n])) for n in mine},
            "clip_param_moved": {n: float(np.linalg.norm(want[n] - start[n])) for n in mine},
            "clip_param_norm": {n: float(np.linalg.norm(want[n])) for n in mine},
            "clip_reduction": reduction_length(list(ref.trainable_params()), 32)}


def backward_training(steps=2, lr=1e-2):
    """Two fresh models with the same values (and a one-device copy) trained `steps` Adam steps, one
    as `loss = model(*batch); loss.backward(); model.optimizer_step(opt)` (torch-style backward,
    enable_mindspore_backward_compat), the other with train_step (value_and_grad): the names of this
    group's losses, gradients and parameters where the two differ at all (the same ops in the same
    order: none), and the backward path against one device (mpmd_models.assert_same_training:
    "ok" or its message)."""
    from mpmd_models import assert_same_training, train_by_backward, train_parallel

    net, ref = make_pair(lambda: Multimodal(text_layers=2))
    by_grad, _ = make_pair(lambda: Multimodal(text_layers=2))
    batches = [multimodal_batch(seed=20 + s) for s in range(steps)]
    model = mh.auto_parallelize(net, load_parallel_config(CONFIG), mode="distributed")
    losses, first, _ = train_by_backward(model, batches, lr)
    mine = {p.name: p.asnumpy() for p in model.optimizer_parameters()}  # this rank's group's parameters
    grad_model = mh.auto_parallelize(by_grad, load_parallel_config(CONFIG), mode="distributed")
    want_losses, want_first, want_all = train_parallel(grad_model, batches, lr)
    differ = [] if losses == want_losses else ["loss"]
    differ += [n for n in first if not np.array_equal(first[n], want_first[n])]
    differ += [n for n in mine if not np.array_equal(mine[n], want_all[n])]
    ref_losses, ref_first, ref_params = train_reference(ref, batches, lr)
    try:
        assert_same_training((losses, first, mine), (ref_losses, {n: ref_first[n] for n in first},
                                                     {n: ref_params[n] for n in mine}), lr)
        versus_one_device = "ok"
    except AssertionError as exc:
        versus_one_device = str(exc)
    return {"backward_differs_from_train_step": differ, "backward_vs_one_device": versus_one_device,
            "backward_params": sorted(mine)}


if __name__ == "__main__":
    for what in sys.argv[2:] or ["train"]:
        if what == "rlhf":
            import rlhf_worker

            os.makedirs(os.path.join(sys.argv[1], "rlhf"), exist_ok=True)
            rlhf_worker.main(os.path.join(sys.argv[1], "rlhf"))
        else:
            main(sys.argv[1], what)
