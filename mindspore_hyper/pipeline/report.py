"""The StepReport of a pipelined model: memory per device of its stages, the stages' collectives,
and its pipeline section (`PipelineSection`): the schedule, stage-boundary send/recv bytes and the
schedule's timeline with measured per-stage costs."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from mindspore_hyper.context import get_context
from mindspore_hyper.pipeline.pipeline_step_memory import pipeline_step_memory
from mindspore_hyper.runtime.report import KINDS, StepReport
from mindspore_hyper.units import format_bytes

__all__ = ["pipeline_report", "PipelineSection"]


@dataclass
class PipelineSection:
    """The pipeline part of a PipelineModel's StepReport (`StepReport.pipeline`).

    Attributes:
        schedule: the schedule kind, e.g. "1f1b".
        ranks: pipeline ranks.
        chunks: model chunks per rank.
        microbatches: microbatches per step.
        split: layers per virtual stage.
        p2p: stage boundary ("stage 0->1") -> activation / gradient send counts and bytes per step.
        timeline: the schedule's ScheduleTimeline simulated with the measured per-stage costs, or
            None (a dry run, or under msrun before `measured_timeline()` was called after the step).
    """

    schedule: str
    ranks: int
    chunks: int
    microbatches: int
    split: Tuple[int, ...]
    p2p: Dict[str, Dict[str, int]] = field(default_factory=dict)
    timeline: Optional[object] = None

    def lines(self) -> List[str]:
        """The section as text lines (the schedule, the boundary sends, the timeline's figures)."""
        out = [f"pipeline: {self.schedule}, {self.ranks} ranks x {self.chunks} chunk(s), {self.microbatches} "
               f"microbatches, layers per stage {list(self.split)}; activations = stage inputs kept for the "
               f"recomputing backwards"]
        if self.p2p:
            out.append("pipeline stage-boundary sends per step (activations / gradients):")
            head = ["boundary", "act count", "act bytes", "grad count", "grad bytes"]
            rows = [[k, str(v["activation_count"]), format_bytes(v["activation_bytes"]), str(v["gradient_count"]),
                     format_bytes(v["gradient_bytes"])] for k, v in self.p2p.items()]
            widths = [max(len(x) for x in col) for col in zip(head, *rows)]
            out += ["  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in [head] + rows]
        if self.timeline is not None:
            out.append(f"pipeline timeline (simulated with measured costs): makespan "
                       f"{self.timeline.makespan * 1e3:.1f} ms, bubble {self.timeline.bubble_fraction:.1%}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict:
        """Plain values (JSON-ready); the timeline as its makespan and bubble fraction."""
        timeline = None if self.timeline is None else {"makespan_s": self.timeline.makespan,
                                                       "bubble_fraction": self.timeline.bubble_fraction}
        return {"schedule": self.schedule, "ranks": self.ranks, "chunks": self.chunks,
                "microbatches": self.microbatches, "split": list(self.split),
                "p2p": {k: dict(v) for k, v in self.p2p.items()}, "timeline": timeline}


def pipeline_report(model, optimizer=None) -> StepReport:
    """See PipelineModel.report."""
    mesh, axis, schedule = model.mesh, model.options.axis, model.schedule
    a = mesh.axis_index(axis)
    # in one process every device of the job is reported (a dry run computes one representative
    # device per stage, but its figures are every device's)
    devices = list(mesh.ranks) if model.in_one_process else list(model.held_devices)
    stage_reports = {s: sm.report(optimizer) for s, sm in model.stage_models.items()}
    memory: Dict[int, Dict[str, int]] = {}
    placed: Dict[int, Tuple[int, int]] = {}  # device -> (pipeline rank, rank on the stage mesh)
    for g in devices:
        coords = mesh.coords(g)
        pipeline_rank = coords[a]
        local = _stage_rank(model, coords, a)
        placed[g] = (pipeline_rank, local)
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
        # mixed precision's compute-dtype copies of the rank's stages' weights (as a one-stage report)
        working = sum(stage_reports[s].memory[local].get("working_weights", 0)
                      for s in schedule.stages_of(pipeline_rank) if s in stage_reports)
        if working:
            row["working_weights"] = working
            row["total"] += working
        memory[g] = row
    comm, comm_backward, fallbacks, comm_causes = {}, {}, {}, {}
    for s, rep in stage_reports.items():
        for target, source in ((comm, rep.comm), (comm_backward, rep.comm_backward)):
            for kind, axes in source.items():
                for ax, v in axes.items():
                    target.setdefault(kind, {})[f"{ax}@stage{s}"] = dict(v)
        for phase, kinds in rep.comm_causes.items():  # what caused them, under the same "axis@stageS"
            for kind, axes in kinds.items():
                for ax, causes in axes.items():
                    comm_causes.setdefault(phase, {}).setdefault(kind, {})[f"{ax}@stage{s}"] = dict(causes)
        for op, n in rep.fallbacks.items():
            fallbacks[op] = fallbacks.get(op, 0) + n
    norm = model.norm_sync.accounting  # the global norm's all-reduce over the whole mesh (not one stage's)
    for (kind, ax), (count, nbytes, input_bytes) in norm.comm_backward.items():
        comm_backward.setdefault(kind, {})[ax] = {"count": count, "bytes": nbytes, "input_bytes": input_bytes}
    for (kind, ax), causes in norm.comm_backward_causes.items():
        comm_causes.setdefault("backward", {}).setdefault(kind, {})[ax] = dict(causes)
    p2p: Dict[str, Dict[str, int]] = {}
    for runner in model.runners.values():
        for (payload, src, dst), (count, nbytes) in runner.sent_bytes.items():
            entry = p2p.setdefault(f"stage {src}->{dst}", {"activation_count": 0, "activation_bytes": 0,
                                                            "gradient_count": 0, "gradient_bytes": 0})
            entry[f"{payload}_count"] += count
            entry[f"{payload}_bytes"] += nbytes
    timeline = None  # a dry run's action times are shape inference, not a device's: no measured timeline
    if model.runtime.computes_values() and model.last_events and (model.in_one_process
                                                                 or model.measured_step == model.steps_run):
        timeline = model.simulated_timeline()
    section = PipelineSection(schedule.kind, schedule.num_stages, schedule.num_chunks, schedule.num_microbatches,
                              tuple(model.split), p2p, timeline)
    report = StepReport(mesh=dict(zip(mesh.alias_names, mesh.device_matrix)), memory=memory, comm=comm,
                        comm_backward=comm_backward, fallbacks=fallbacks, device_memory=get_context("device_memory"),
                        step_seconds=model.last_step_seconds, simulated=model.in_one_process, pipeline=section,
                        comm_causes=comm_causes)
    report.step_memory = pipeline_step_memory(model, optimizer, memory, placed, stage_reports)
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
