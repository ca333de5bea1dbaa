"""A pipelined model's step memory: per pipeline rank, the bytes over its schedule's actions.

The series of one pipeline rank (every device of that rank alike: its stages are SPMD programs on
the stage sub-mesh) follows its action list as the last step ran it (`StageRunner.kept_inputs`):

- a forward of stage s on microbatch k runs without recording (computation.py): its point holds
  the stage inputs (and dropout masks) the rank keeps for backwards after it, counted whole as the
  runner keeps them; the no-grad forward's own transient activations are not counted (they are at
  most the recompute's forward, which the backward's points count);
- a backward of stage s on microbatch k recomputes the stage's forward under grad and runs its
  backward: one point per op of the stage's own series (`runtime/step_memory.py`, from the stage
  model's accounting of that recompute; every microbatch has the same shapes), its forward ops
  then their backwards, each adding the inputs kept when the action began (k's own included);
  an input-gradient-only backward (zero bubble "B") makes no parameter gradient (and on the first
  stage runs nothing), the weight pass ("W") makes them;
- parameter gradients accumulate over microbatches: once a stage's first weight gradient was
  made, all of its parameters' gradients stay alive until the update (and while the next
  microbatch's gradients are made, both are alive: the old sum and the new term);
- the update: every gradient of the rank's stages, no activation.

Each device's step peak = its parameters + optimizer states (+ mixed precision's working weights)
+ its rank's series peak; rounded: every block (kept input, activation, gradient, parameter,
optimizer state) rounded to the context's `allocator_alignment`, then the fragmentation allowance.
The series needs the stages' DTensor accounting: a pipeline over the pipeline axis alone runs its
stages as plain cells (no accounting), and has none (`None`).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Dict, List, Optional, Tuple

from mindspore_hyper.context import get_context
from mindspore_hyper.runtime.report import rounded_model_states
from mindspore_hyper.runtime.step_memory import StepMemory, StepMemoryPoint, round_block, step_memory
from mindspore_hyper.schedule.actions import ActionKind

__all__ = ["pipeline_step_memory", "rank_series"]


def _kept(sizes: Counter, alignment: int) -> int:
    return sum(round_block(size, alignment) * count for size, count in sizes.items())


def rank_series(kept_inputs, stage_series: Dict[int, Tuple[StepMemory, StepMemory]], alignment: int) -> StepMemory:
    """One pipeline rank's series (module docstring).

    Args:
        kept_inputs: the rank runner's `kept_inputs`: (compute action, kept sizes before, after).
        stage_series: stage -> (its series with parameter gradients, without), at `alignment`.
        alignment: the bytes every kept input is rounded up to (1: exact).

    Returns:
        The StepMemory over the rank's actions, then the update.
    """
    points: List[StepMemoryPoint] = []
    accumulated: Dict[int, int] = {}  # stage -> bytes of its parameters' gradients, once made
    for action, before, after in kept_inputs:
        s, k = action.stage, action.microbatch
        grads = sum(accumulated.values())
        if action.kind is ActionKind.FORWARD:
            points.append(StepMemoryPoint("forward", f"stage {s} microbatch {k} (inputs kept)",
                                          _kept(after, alignment), grads))
            continue
        if action.kind is ActionKind.BACKWARD_INPUT and s == 0:
            continue  # the first stage has no input gradient: its input pass runs nothing (computation.py)
        full, input_only = stage_series[s]
        series = input_only if action.kind is ActionKind.BACKWARD_INPUT else full
        kept = _kept(before, alignment)
        for p in series.points[:-1]:  # the stage's own update point is the rank's, at the end
            op = f"{p.op} (stage {s} microbatch {k}{', recomputed' if p.phase == 'forward' else ''})"
            points.append(StepMemoryPoint(p.phase, op, kept + p.activations, grads + p.gradients))
        if action.kind is not ActionKind.BACKWARD_INPUT and full.points:
            accumulated[s] = full.points[-1].gradients
    points.append(StepMemoryPoint("optimizer", "update", 0, sum(accumulated.values())))
    return StepMemory(tuple(points), alignment)


def _section_of(series: StepMemory, rounded: StepMemory) -> dict:
    return {"timeline": series.to_rows(), "peak_phase": series.peak.phase, "peak_op": series.peak.op,
            "rounded_peak_phase": rounded.peak.phase, "rounded_peak_op": rounded.peak.op}


def pipeline_step_memory(model, optimizer, memory: Dict[int, Dict[str, int]],
                         devices: Dict[int, Tuple[int, int]], stage_reports: Dict[int, object]) -> Optional[dict]:
    """The `step_memory` section of a PipelineModel's StepReport (module docstring).

    Args:
        model: the PipelineModel after a training step.
        optimizer: the step's optimizer (None: each parameter's states as the stage reports count them).
        memory: device -> its memory row (the pipeline report's).
        devices: device -> (its pipeline rank, its rank on the stage mesh).
        stage_reports: stage -> the StepReport of its stage model.

    Returns:
        The section: the timeline, peak phase and op (exact and rounded) of the pipeline rank of
        the first device with the highest step peak (`timeline_pipeline_rank`), the same per pipeline rank
        (`per_pipeline_rank`), the rounding and fragmentation used, and per device the step peak
        exact, rounded and with the fragmentation allowance; None when the stages have no
        accounting (plain cells) or the step ran no backward.
    """
    if not model.stage_models or not all(getattr(sm, "last_forward_recorded_gradients", False)
                                         for sm in model.stage_models.values()):
        return None
    alignment, fragmentation = get_context("allocator_alignment"), get_context("allocator_fragmentation")
    series: Dict[int, Dict[int, Tuple[StepMemory, StepMemory]]] = {a: {} for a in (1, alignment)}
    for s, sm in model.stage_models.items():
        trainable = {id(p) for p in sm.network.trainable_params()}
        for a in series:
            series[a][s] = (step_memory(sm.accounting, a, trainable), step_memory(sm.accounting, a, set()))
    per_rank = {r: {a: rank_series(runner.kept_inputs, series[a], a) for a in series}
                for r, runner in sorted(model.runners.items())}
    per_device = {}
    for g, (r, local) in devices.items():
        stages = [s for s in model.schedule.stages_of(r) if s in model.stage_models]
        states = sum(rounded_model_states(model.stage_models[s], optimizer, [local], stage_reports[s].simulated,
                                          alignment)[local] for s in stages)
        working = sum(stage_reports[s].memory[local].get("working_weights", 0) for s in stages)
        m = memory[g]
        rounded = states + working + per_rank[r][alignment].peak.total
        per_device[g] = {
            "step_peak": m["parameters"] + m["optimizer_states"] + working + per_rank[r][1].peak.total,
            "step_peak_rounded": rounded,
            "step_peak_with_fragmentation": math.ceil(rounded * (1 + fragmentation)),
        }
    top = devices[max(per_device, key=lambda g: per_device[g]["step_peak"])][0]  # the first device at the most
    return {**_section_of(per_rank[top][1], per_rank[top][alignment]), "timeline_pipeline_rank": top,
            "per_pipeline_rank": {r: _section_of(v[1], v[alignment]) for r, v in per_rank.items()},
            "alignment_bytes": alignment, "fragmentation": fragmentation, "per_device": per_device}
