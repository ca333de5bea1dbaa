"""One training step of a PipelineModel, with ParallelModel's step options.

The step splits the batch into microbatches, runs every rank's action list (all ranks
interleaved in this process in simulation; this process's rank under msrun), sums each
Parameter's gradient over the microbatches and over the stages that use it, and steps the
optimizer once. Its options are ParallelModel.train_step's:

- `max_grad_norm`: the gradients are scaled to that global norm, counted over every stage
  (global_grad_norm.py), as `mindspore.ops.clip_by_global_norm` does on one device;
- `loss_scale`: every microbatch's loss (and auxiliary loss) is multiplied by the scaler's
  value in its stage's backward, so the gradients crossing stage boundaries are scaled too; the
  summed gradients are divided by it, and when the global norm is not finite the update is
  skipped on every process and the scaler adjusted (runtime/loss_scale.py);
- `accumulation_steps`: refused above 1. A pipeline already accumulates the gradients of its
  microbatches before one update: k accumulated steps of m microbatches give the gradients of one
  step of k*m microbatches on the concatenated batch, which runs one fill and drain of the
  schedule instead of k (a smaller bubble), so the option would only add a slower way to the
  same update.
"""
from __future__ import annotations

import time
from typing import Dict

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from mindspore_hyper.comm.collective_cause import CLIP_NORM_CAUSE, GRAD_NORM_CAUSE
from mindspore_hyper.dtensor.meta import meta
from mindspore_hyper.pipeline.global_grad_norm import pipeline_grad_norm, sum_over_mesh
from mindspore_hyper.pipeline.microbatch import loss_scale as microbatch_scale, split_microbatches
from mindspore_hyper.runtime import loss_scale as scaling
from mindspore_hyper.runtime.accumulation import check_accumulation_steps
from mindspore_hyper.runtime.grad_clip import check_max_norm
from mindspore_hyper.runtime.guarded_update import guarded_update
from mindspore_hyper.runtime.optimizer_check import optimizer_gradients

__all__ = ["run_train_step", "check_pipeline_options"]


def check_pipeline_options(microbatches: int, max_grad_norm, accumulation_steps, loss_scale, computes_values: bool):
    """The step options as (max_grad_norm or None, loss scaler or None).

    Args:
        microbatches: the schedule's microbatches per step (named in the accumulation message).
        max_grad_norm, accumulation_steps, loss_scale: train_step's options.
        computes_values: whether the runtime computes values (False: a dry run).

    Returns:
        (max_grad_norm as a float or None, a mindspore.amp LossScaler or None).

    Raises:
        ValueError: naming the option: `max_grad_norm` not a finite number > 0; `loss_scale` not
            None, a number >= 1 or a mindspore.amp loss scaler; `accumulation_steps` other than 1
            (the message says to raise the microbatches instead); clipping or loss scaling in a
            dry run (no gradient values).
    """
    steps = check_accumulation_steps(accumulation_steps)
    if steps != 1:
        raise ValueError(f"train_step: accumulation_steps={steps} is not supported by the pipeline model: a pipeline "
                         f"already accumulates its microbatches' gradients before one update; for the same update "
                         f"pass the {steps} batches concatenated to one train_step with {steps * microbatches} "
                         f"microbatches (pipeline=dict(microbatches={steps * microbatches})): one fill and drain of "
                         f"the schedule instead of {steps}")
    if max_grad_norm is not None:
        max_grad_norm = check_max_norm(max_grad_norm, "max_grad_norm")
    scaler = scaling.as_loss_scaler(loss_scale)
    if not computes_values and (max_grad_norm is not None or scaler is not None):
        named = [n for n, v in (("max_grad_norm", max_grad_norm), ("loss_scale", scaler)) if v is not None]
        raise ValueError(f"dry run: train_step option(s) {named} are not modelled by the dry run yet (a pipeline's "
                         f"dry run has no gradient values); run without them")
    return max_grad_norm, scaler


def run_train_step(model, optimizer: nn.Optimizer, inputs, max_grad_norm=None, accumulation_steps=1,
                   loss_scale=None) -> Tensor:
    """PipelineModel `model`'s train_step (module docstring; Args, Returns and Raises as
    PipelineModel.train_step). The step's figures go on the model: `last_loss`, `last_gradients`,
    `last_grad_norm`, `last_step_skipped`, `last_events`, `last_step_seconds`, `steps_run`."""
    max_grad_norm, scaler = check_pipeline_options(model.schedule.num_microbatches, max_grad_norm,
                                                   accumulation_steps, loss_scale,
                                                   model.runtime.computes_values())
    factor = scaling.scale_value(scaler) if scaler is not None else None
    start = time.perf_counter()
    model.norm_sync.accounting.reset_step()  # the report lists the last step's norm all-reduce
    microbatches = split_microbatches(inputs, model.schedule.num_microbatches)
    model.trace(microbatches[0], require_loss=True)
    _run_schedule(model, microbatches, factor if factor is not None else 1.0)
    if not model.runtime.computes_values():  # a dry run: shapes recorded, nothing to update
        sum_over_mesh(model, 0.0, GRAD_NORM_CAUSE)  # the norm's all-reduce, as the simulation records it
        return _finish(model, start, meta((), ms.float32))
    found = _summed_gradients(model)
    if factor is not None:
        found = {pid: scaling.unscale(g, factor) for pid, g in found.items()}
    names = _parameter_names(model)
    model.last_gradients = {names[pid]: g.asnumpy() for pid, g in found.items()}
    grads = optimizer_gradients(optimizer, found, allowed={id(p) for p in model.optimizer_parameters()},
                                missing=lambda p: ops.zeros(p.shape, p.dtype))
    norm = pipeline_grad_norm(model, found, GRAD_NORM_CAUSE if max_grad_norm is None else CLIP_NORM_CAUSE)
    guarded_update(model, grads, norm, scaler, max_grad_norm, optimizer)
    model.last_loss = _loss(model)
    _finish(model, start, None)
    if model.rebalancing.active(model) and model.steps_run > 1:  # the first step's times include building graphs
        model.rebalancing.rebalance(model, optimizer)
    return Tensor(np.float32(model.last_loss))


def _parameter_names(model) -> Dict[int, str]:
    """id(Parameter) -> the model's name of it, for the Parameters of this process's stages (under
    msrun a stage on a sub-mesh holds its shards as Parameters of its own, of the same names)."""
    names: Dict[int, str] = {}
    for s, computation in model.computations.items():
        in_cell = {id(p): name for name, p in model.stage_cells[s].parameters_and_names()}
        names.update({id(p): in_cell.get(id(p), p.name) for p in computation.params})
    return names


def _finish(model, start: float, result):
    model.last_events = [e for r in model.ranks for e in model.runners[r].events]
    model.last_step_seconds = time.perf_counter() - start
    model.steps_run += 1
    return result


def _run_schedule(model, microbatches, gradient_scale: float) -> None:
    """Every held rank's actions on `microbatches`; each stage's backward seeded with its
    microbatch factor times `gradient_scale` (the loss scale, or 1)."""
    for c in model.computations.values():
        c.reset(gradient_scale)
    for runner in model.runners.values():
        runner.start_step(microbatches)
    if model.in_one_process:
        runners = list(model.runners.values())
        while not all(r.done for r in runners):
            if sum(r.advance(blocking=False) for r in runners) == 0:
                stuck = {r.rank: str(r.actions[r.pc]) for r in runners if not r.done}
                raise RuntimeError(f"pipeline: no rank can progress (waiting: {stuck})")
    else:
        model.transport.expect(model.recv_counts)
        model.runners[model.ranks[0]].advance(blocking=True)
        model.transport.flush()


def _summed_gradients(model) -> Dict[int, Tensor]:
    """id(Parameter) -> its gradient summed over the microbatches and the stages using it."""
    found: Dict[int, Tensor] = {}
    for c in model.computations.values():
        for key, g in c.grads.items():
            found[key] = g if key not in found else found[key] + g
    return found


def _loss(model) -> float:
    """The step's loss on every process: the last stage's, plus every stage's auxiliary losses."""
    schedule = model.schedule
    last = len(model.split) - 1
    scale = microbatch_scale(model.reduction, schedule.num_microbatches)
    owner = model.process_of(schedule.stage_to_rank[last])
    value = sum(model.computations[last].losses) * scale if last in model.computations else 0.0
    aux = sum(sum(c.aux_losses) for c in model.computations.values()) * scale
    if not model.in_one_process and model.world.size > 1:
        # the last stage's loss, plus every stage's auxiliary losses (each pipeline rank's as
        # its first process computed them), on every process
        parts = model.runtime.gather_values(np.array([value, aux], dtype=np.float64))
        value = float(parts[owner, 0])
        aux = sum(float(parts[model.process_of(r), 1]) for r in range(schedule.num_ranks))
    return float(value + aux)

