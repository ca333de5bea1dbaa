"""The StepReport of a pipelined model: memory per device of its stages, the stages' collectives,
stage-boundary send/recv bytes and the schedule's timeline with measured per-stage costs."""
from __future__ import annotations

import math
from typing import Dict

import numpy as np

from mindspore_hyper.context import get_context
from mindspore_hyper.runtime.report import KINDS, StepReport

__all__ = ["pipeline_report"]


def pipeline_report(model, optimizer=None) -> StepReport:
    """See PipelineModel.report."""
    mesh, axis, schedule = model.mesh, model.options.axis, model.schedule
    a = mesh.axis_index(axis)
    # in one process every device of the job is reported (a dry run computes one representative
    # device per stage, but its figures are every device's)
    devices = list(mesh.ranks) if model.in_one_process else list(model.held_devices)
    stage_reports = {s: sm.report(optimizer) for s, sm in model.stage_models.items()}
    memory: Dict[int, Dict[str, int]] = {}
    for g in devices:
        coords = mesh.coords(g)
        pipeline_rank = coords[a]
        local = _stage_rank(model, coords, a)
        row = {k: 0 for k in KINDS}
        for s in schedule.stages_of(pipeline_rank):
            if s in stage_reports:
                for k in ("parameters", "gradients", "optimizer_states"):
                    row[k] += stage_reports[s].memory[local][k]
            else:
                nbytes = sum(math.prod(p.shape) * p.dtype.itemsize for p in model.stage_cells[s].trainable_params())
                row["parameters"] += nbytes
                row["gradients"] += nbytes
                row["optimizer_states"] += _stage_optimizer_bytes(model.stage_cells[s], optimizer, nbytes)
        runner = model.runners.get(pipeline_rank)
        row["activations_peak"] = runner.peak_live_bytes if runner is not None else 0
        row["total"] = sum(row[k] for k in KINDS)
        memory[g] = row
    comm, comm_backward, fallbacks = {}, {}, {}
    for s, rep in stage_reports.items():
        for target, source in ((comm, rep.comm), (comm_backward, rep.comm_backward)):
            for kind, axes in source.items():
                for ax, v in axes.items():
                    target.setdefault(kind, {})[f"{ax}@stage{s}"] = dict(v)
        for op, n in rep.fallbacks.items():
            fallbacks[op] = fallbacks.get(op, 0) + n
    p2p: Dict[str, Dict[str, int]] = {}
    for runner in model.runners.values():
        for (payload, src, dst), (count, nbytes) in runner.sent_bytes.items():
            entry = p2p.setdefault(f"stage {src}->{dst}", {"activation_count": 0, "activation_bytes": 0,
                                                            "gradient_count": 0, "gradient_bytes": 0})
            entry[f"{payload}_count"] += count
            entry[f"{payload}_bytes"] += nbytes
    timeline = None  # a dry run's action times are shape inference, not a device's: no measured timeline
    if model.runtime.computes_values() and model.last_events and (model.in_one_process
                                                                 or model._measured_step == model._steps):
        timeline = model.simulated_timeline()
    report = StepReport(mesh=dict(zip(mesh.alias_names, mesh.device_matrix)), memory=memory, comm=comm,
                        comm_backward=comm_backward, fallbacks=fallbacks, device_memory=get_context("device_memory"),
                        step_seconds=model.last_step_seconds, simulated=model.in_one_process,
                        p2p=p2p, timeline=timeline)
    report.notes.append(f"pipeline: {schedule.kind}, {schedule.num_stages} ranks x {schedule.num_chunks} chunk(s), "
                        f"{schedule.num_microbatches} microbatches, layers per stage {list(model.split)}; "
                        f"activations = stage inputs kept for the recomputing backwards")
    report.check_memory()
    return report


def _stage_rank(model, coords, a: int) -> int:
    if model.stage_mesh is None:
        return 0
    if not model.in_one_process:
        return model.stage_processes.index(model.held_devices[0])  # the stage rank its DistributedModel reports
    rest = tuple(c for i, c in enumerate(coords) if i != a)
    return int(np.ravel_multi_index(rest, model.stage_mesh.device_matrix))


def _stage_optimizer_bytes(cell, optimizer, param_bytes: int) -> int:
    """Bytes of `optimizer`'s states of `cell`'s parameters (states named `<prefix>.<param name>`),
    or 2 per parameter (Adam) without an optimizer."""
    if optimizer is None:
        return 2 * param_bytes
    names = {p.name for p in cell.trainable_params()}
    total = 0
    for _, state in optimizer.parameters_and_names():
        _, _, pname = state.name.partition(".")
        if pname in names:
            total += math.prod(state.shape) * state.dtype.itemsize
    return total
