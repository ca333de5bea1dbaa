"""Worker of the context-parallel msrun tests: a model trained with context parallelism over a
data x cp mesh of processes, and the same model on one device in the same process; writes per
rank and case what the test compares (forward output, first-step gradients, losses and parameters
after 5 momentum steps, relative errors) and what the ring did (blocks computed per pass, timed
asynchronous shifts per pass, the cp traffic recorded) and how far `loss.backward()`'s gradients are
from `value_and_grad`'s.

Usage (under msrun): cp_worker.py OUT_DIR CASE [CASE ...], a CASE being
"<model>-<method>@<data>x<cp>": model gpt (the examples' GPT, causal mask) or encoder (a
TransformerEncoderLayer classifier, padding mask), method ring or ulysses, on the mesh data x cp
of the job's processes (one job runs the cases of several meshes of its size, one after another).
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import json
import os
import sys
from collections import Counter

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # sim_models
ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout, auto_parallelize  # noqa: E402
from mindspore_hyper.dtensor.context_parallel.ring_core import RingAttention  # noqa: E402
from mindspore_hyper.hyper_parallel.autograd_compat import (  # noqa: E402
    disable_mindspore_backward_compat, enable_mindspore_backward_compat,
)
from models import GPT  # noqa: E402
from sim_models import Classifier  # noqa: E402

STEPS, SEQ = 5, 16


def build(model: str):
    ms.set_seed(1)
    return GPT(vocab=32, hidden=16, heads=4, layers=1, seq=SEQ) if model == "gpt" else Classifier()


def batches(model: str, data: int):
    """STEPS (inputs, labels) pairs of `data` sequences; the encoder's first sequence is padded
    from position 5 on."""
    rng = np.random.default_rng(1)
    out = []
    for _ in range(STEPS):
        if model == "gpt":
            out.append(((Tensor(rng.integers(0, 32, (data, SEQ)).astype(np.int32)),),
                        (Tensor(rng.integers(0, 32, (data, SEQ)).astype(np.int32)),)))
        else:
            padding = np.zeros((data, SEQ), bool)
            padding[0, 5:] = True
            out.append(((Tensor(rng.standard_normal((data, SEQ, 16)).astype(np.float32)), Tensor(padding)),
                        (Tensor(rng.integers(0, 3, (data,)).astype(np.int32)),)))
    return out


def relative_error(got, want) -> float:
    return float(np.abs(np.asarray(got) - np.asarray(want)).max() / max(np.abs(np.asarray(want)).max(), 1e-30))


def backward_error(par, params, batch) -> float:
    """`loss.backward()` (`enable_mindspore_backward_compat`, MindFormers' Trainer) through the
    attention (ring or Ulysses), the collectives and the parameter gradient sums vs
    `value_and_grad` on the same parameters and batch: the largest relative difference of a
    parameter's gradient."""
    inputs, labels = batch
    _, grads = ms.value_and_grad(par, None, params)(*inputs, *labels)
    enable_mindspore_backward_compat()
    try:
        par(*inputs, *labels).backward()
        return max(relative_error(p.grad.asnumpy(), g.asnumpy()) for p, g in zip(params, grads))
    finally:
        disable_mindspore_backward_compat()


def main(out_dir: str, case: str) -> None:
    name, _, mesh = case.partition("@")
    model_name, method = name.split("-")
    data, cp = (int(v) for v in mesh.split("x"))
    ref, model = build(model_name), build(model_name)
    data_batches = batches(model_name, data)
    strategy = Layout((data, cp), ("data", "cp"))(tensor_map=(), context_parallel="cp", context_method=method)
    par = auto_parallelize(model, strategy)
    rings = []  # the RingAttention cells of this process, in order
    made = RingAttention.__init__

    def spy(self, *args, **kwargs):
        made(self, *args, **kwargs)
        rings.append(self)

    RingAttention.__init__ = spy
    collectives = par.execution.collectives
    inputs = data_batches[0][0]
    out = {"rank": par.local_ranks[0], "losses": [], "ref_losses": [],
           "forward_error": relative_error(par(*inputs).asnumpy(), ref(*inputs).asnumpy())}
    optimizer = nn.Momentum(par.optimizer_parameters(), 0.05, 0.9)
    ref_opt = nn.Momentum(ref.trainable_params(), 0.05, 0.9)
    ref_step = ms.value_and_grad(ref, None, ref_opt.parameters)
    for step, (inputs, labels) in enumerate(data_batches):
        rings.clear()
        timings_before = len(getattr(collectives, "ring_timings", ()))
        out["losses"].append(float(par.train_step(optimizer, *inputs, *labels).asnumpy()))
        ref_loss, ref_grads = ref_step(*inputs, *labels)
        ref_opt(ref_grads)
        out["ref_losses"].append(float(ref_loss.asnumpy()))
        if step == 0:
            out["grad_error"] = max(relative_error(par.last_gradients[p.name], g.asnumpy())
                                    for p, g in zip(ref_opt.parameters, ref_grads))
            report = par.report(optimizer)
            out["comm"], out["comm_backward"] = report.comm, report.comm_backward
            out["blocks"] = [ring.computed for ring in rings]
            out["zigzag"] = [ring.plan.per_rank == 2 for ring in rings]
            timings = list(getattr(collectives, "ring_timings", ()))[timings_before:]
            out["timed_shifts"] = dict(Counter(t.phase for t in timings))
            out["timed_bytes"] = {phase: sum(t.nbytes for t in timings if t.phase == phase)
                                  for phase in ("forward", "backward")}
    RingAttention.__init__ = made
    out["backward_error"] = backward_error(par, model.trainable_params(), data_batches[0])
    out["param_error"] = max(relative_error(p.asnumpy(), r.asnumpy())
                             for p, r in zip(model.trainable_params(), ref.trainable_params()))
    with open(os.path.join(out_dir, f"{case}-rank{out['rank']}.json"), "w") as f:
        json.dump(out, f, default=str)


if __name__ == "__main__":
    mh.set_context(mode="distributed", comm_timeout=60.0)
    for name in sys.argv[2:]:
        main(sys.argv[1], name)
