"""Run by test_pipeline_stage_msrun.py under `mindspore-hyper run --processes 2`: a pipeline script in
upstream's form (each rank builds the whole model, keeps its stage's layers, wraps them in a
PipelineStage; `schedule.run(x)` on stage 0, `schedule.run()` on the other) trains 3 Adam steps
with 1F1B, then one GPipe step, each rank checking its stage against one device running the
same layers in the same process. Then refusals reach every rank: a bad batch on rank 0 (before
any transfer; the pipeline trains on after it), a DTensor output of stage 0 taken by a stage laid
out on a mesh of another shape (during the step: rank 1 refuses it, and rank 0 gets rank 1's
ValueError instead of waiting for its gradient), and every step after a failed one. Exits non-zero on the first mismatch.

Tolerance: as tests/hyper_parallel/test_pipeline.py (float32 sums reassociated over at most 8
terms: below 1e-6; rtol 1e-5, atol 1e-6, 1e-5 on weights after Adam's steps)."""
import os

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn
from mindspore.communication.management import get_group_size, get_rank, init

from hyper_parallel import DTensor, PipelineStage, Schedule1F1B, ScheduleGPipe, distribute_module, init_device_mesh
from hyper_parallel.core.dtensor.placement_types import Replicate
from pipeline_layers import Block, Head

init()
rank, size = get_rank(), get_group_size()
assert size == 2, size
M, BATCH = 4, 8


def build():
    ms.set_seed(0)  # every rank and the reference build the same initial values
    return nn.SequentialCell([Block(), Block(), Block(), Head()])


model, reference = build(), build()
mine = nn.SequentialCell([model[2 * rank], model[2 * rank + 1]])  # this rank's two layers
stage = PipelineStage(mine, rank, size)
params = mine.trainable_params()
opt = nn.Adam(params, learning_rate=0.05)
ref_params = reference.trainable_params()
ref_opt = nn.Adam(ref_params, learning_rate=0.05)
ref_mine = [q for p, q in zip(model.trainable_params(), ref_params) if any(p is r for r in params)]


def reference_step(x):
    """One device: the sum of the microbatches' losses (M times the whole batch's mean loss)."""
    return ms.value_and_grad(lambda x: reference(x) * M, None, ref_params)(x)


def check(outputs, loss, what):
    if stage.is_last_stage:
        assert len(outputs) == M, (what, len(outputs))
        np.testing.assert_allclose(sum(float(o.asnumpy()) for o in outputs), float(loss.asnumpy()), rtol=1e-5,
                                   atol=1e-6, err_msg=what)
    else:
        assert outputs == [], what


schedule = Schedule1F1B(stage, M)
for step in range(3):
    x = Tensor(np.random.RandomState(step).randn(BATCH, 8).astype(np.float32))
    outputs = schedule.run(x) if stage.is_first_stage else schedule.run()
    loss, grads = reference_step(x)
    check(outputs, loss, f"1F1B step {step}")
    by_id = {id(q): g for q, g in zip(ref_params, grads)}
    for p, q in zip(params, ref_mine):
        np.testing.assert_allclose(p.grad.asnumpy(), by_id[id(q)].asnumpy(), rtol=1e-5, atol=1e-6, err_msg=p.name)
    opt(tuple(p.grad for p in params))
    ref_opt(grads)
    for p in params:
        p.grad = None
for p, q in zip(params, ref_mine):
    np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-5, atol=1e-5, err_msg=p.name)
print(f"rank {rank}: pipeline 1F1B trains 3 Adam steps like one device", flush=True)

x = Tensor(np.random.RandomState(7).randn(BATCH, 8).astype(np.float32))
gpipe = ScheduleGPipe(stage, M)
outputs = gpipe.run(x) if stage.is_first_stage else gpipe.run()
loss, grads = reference_step(x)
check(outputs, loss, "GPipe")
by_id = {id(q): g for q, g in zip(ref_params, grads)}
for p, q in zip(params, ref_mine):
    np.testing.assert_allclose(p.grad.asnumpy(), by_id[id(q)].asnumpy(), rtol=1e-5, atol=1e-6, err_msg=p.name)
print(f"rank {rank}: pipeline GPipe equals one device", flush=True)


def refused_everywhere(run, expected: str, what: str) -> None:
    """`run()` raises on this rank a ValueError or RuntimeError whose message holds `expected`
    (the refusing rank's own, or its message forwarded to this rank); not a timeout."""
    try:
        run()
    except (ValueError, RuntimeError) as exc:
        assert expected in str(exc), (what, exc)
        print(f"rank {rank}: {what} refused on every rank ({type(exc).__name__}: {str(exc)[:100]}...)", flush=True)
        return
    raise AssertionError(f"{what}: not refused on rank {rank}")


class DTensorOutput(nn.Cell):
    """Stage 0 returning a DTensor on a mesh of shape (1,), which travels to rank 1 as its local
    piece and layout; rank 1's stage holds a Parameter laid out on a mesh of shape (1, 1), so it
    has no mesh of the sender's shape to take it on: refused there during the step, while rank 0
    waits for its gradient."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        if rank == 0:
            self.mesh = init_device_mesh("cpu", (1,))  # this rank alone
        else:
            self.square = distribute_module(Block(), init_device_mesh("cpu", (1, 1)))

    def construct(self, x):
        out = self.inner(x)
        return DTensor.from_local(out, self.mesh, (Replicate(),)) if rank == 0 else out


def refusals_reach_every_rank():
    """Under msrun a refusal on one rank is raised on both (see module docstring)."""
    # before any transfer (rank 0's batch of 6 rows in 4 microbatches): the step's agreement;
    # nothing was sent, so the pipeline trains on after it
    refused_everywhere(lambda: gpipe.run(x[:6]) if stage.is_first_stage else gpipe.run(),
                       "micro_batch_num=4 does not divide input 0's batch dimension 0", "a bad batch on rank 0")
    outputs = gpipe.run(x) if stage.is_first_stage else gpipe.run()
    check(outputs, loss, "GPipe after a refused step")
    print(f"rank {rank}: pipeline GPipe equals one device after a refused step", flush=True)
    refusing = ScheduleGPipe(PipelineStage(DTensorOutput(mine), rank, size), M)
    refused_everywhere(lambda: refusing.run(x) if stage.is_first_stage else refusing.run(),
                       "PipelineStage 1: it receives a DTensor laid out on a mesh of shape (1,) (placements "
                       "(Replicate(),)), but its own mesh", "a DTensor activation rank 1 cannot take")
    # the failed step's tensors may still be on their way: every rank refuses the next step
    refused_everywhere(lambda: gpipe.run(x) if stage.is_first_stage else gpipe.run(),
                       "an earlier pipeline step of this job failed", "a step after a failed step")


if "MS_ROLE" in os.environ:  # msrun (a per-rank simulation stops the run at a failing rank's error instead)
    refusals_reach_every_rank()
