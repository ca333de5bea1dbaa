"""Step time of a dry-run (or simulated) step on a hardware preset, from what the step recorded:
every op's FLOPs and bytes on one device (roofline: the slower of compute at the preset's matmul
efficiency and memory traffic at its memory efficiency, plus its per-op overhead) and every
collective with its group (the hierarchical alpha-beta model of `collective_time`).

A training step's backward is timed as twice its forward (the gradients of the inputs and of the
weights: twice the FLOPs and traffic of each op, the standard 1:2 split); collectives as
recorded, forward and backward. No overlap of communication with compute is assumed (an upper
bound): `overlapped_seconds` gives the opposite bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List

from mindspore_hyper.estimate.collective_time import collective_seconds, group_fanouts, transfer_seconds
from mindspore_hyper.estimate.hardware import Hardware
from mindspore_hyper.schedule.build import build_schedule
from mindspore_hyper.schedule.simulation import simulate_schedule

__all__ = ["StepPrediction", "predict_step", "predict_pipeline_step"]

_KINDS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
          "AllToAll": "all_to_all"}


@dataclass
class StepPrediction:
    """Predicted seconds of one step on one device (see module docstring).

    Attributes:
        hardware: the preset's name.
        compute_seconds: forward (and backward for training) op time.
        comm_seconds: collectives, forward and backward.
        flops: FLOPs of the step on one device.
        comm_by_axis: mesh axis -> seconds of its collectives.
        notes: what the prediction assumed.
    """

    hardware: str
    compute_seconds: float
    comm_seconds: float
    flops: float
    comm_by_axis: Dict[str, float] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

    @property
    def step_seconds(self) -> float:
        """No overlap (an upper bound)."""
        return self.compute_seconds + self.comm_seconds

    @property
    def overlapped_seconds(self) -> float:
        """Perfect overlap of collectives with compute (a lower bound)."""
        return max(self.compute_seconds, self.comm_seconds)

    def to_dict(self) -> dict:
        return {"hardware": self.hardware, "step_seconds": self.step_seconds,
                "overlapped_seconds": self.overlapped_seconds, "compute_seconds": self.compute_seconds,
                "comm_seconds": self.comm_seconds, "flops_per_device": self.flops,
                "comm_seconds_by_axis": dict(self.comm_by_axis), "notes": list(self.notes)}


def _axis_group(shape, names, axis: str):
    """(size, stride) of the group along `axis` ("a+b": several axes; stride of the innermost)."""
    index = [list(names).index(n) for n in axis.split("+")]
    return math.prod(shape[i] for i in index), math.prod(shape[max(index) + 1:])


def predict_step(mesh: dict, hardware: Hardware, training: bool = True) -> StepPrediction:
    """The step time of the step recorded in `mesh` on `hardware` (see module docstring).

    Args:
        mesh: one mesh entry of a run's report (`hyper_parallel.report.session_report`): its
            "shape", "dim_names", "compute" rows (op, flops, bytes, calls) and "collectives" rows.
        hardware: a loaded preset (`estimate.hardware.load_hardware`).
        training: time the backward too (twice the forward's ops).

    Raises:
        ValueError: a mesh group larger than the hardware's largest domain.
    """
    passes = 3 if training else 1
    compute = passes * _compute_seconds(mesh["compute"], hardware)
    flops = passes * sum(row["calls"] * row["flops"] for row in mesh["compute"])
    by_axis = _collective_seconds(mesh["collectives"], mesh["shape"], mesh["dim_names"], hardware)
    eff = hardware.efficiency
    notes = [f"roofline per op on {hardware.name} (matmul efficiency {eff.matmul:g}, memory {eff.memory:g})"
             + ("; backward = 2 x forward" if training else "") + "; collectives by the hierarchical alpha-beta "
             "model; no overlap in step_seconds"]
    if hardware.gemm_tiling is not None:
        notes.append(f"{hardware.name}'s GEMM tile and wave quantisation (gemm_tiling) not applied: the recorded ops "
                     "carry FLOPs and bytes, not GEMM shapes (each GEMM at the large-GEMM efficiency)")
    if hardware.validated:
        notes.append(f"{hardware.name}: {hardware.validated}")
    return StepPrediction(hardware.name, compute, sum(by_axis.values()), flops, by_axis, notes)


def _compute_seconds(rows, hardware: Hardware) -> float:
    eff = hardware.efficiency
    flop_rate, byte_rate = hardware.peak_flops * eff.matmul, hardware.memory_bandwidth * eff.memory
    return sum(r["calls"] * (max(r["flops"] / flop_rate, r["bytes"] / byte_rate) + eff.op_overhead) for r in rows)


def _collective_seconds(rows, shape, names, hardware: Hardware) -> Dict[str, float]:
    """Seconds per mesh axis of collective `rows` (axes named without a "@stage" suffix)."""
    by_axis: Dict[str, float] = {}
    for row in rows:
        if row["kind"] not in _KINDS or row["count"] == 0:
            continue
        axis = row["axis"].split("@")[0]
        size, stride = _axis_group(shape, names, axis)
        per_call = row["input_bytes_per_device"] / row["count"]
        n = per_call * size if row["kind"] == "AllGather" else per_call
        fanouts = group_fanouts(hardware, size, stride)
        seconds = row["count"] * collective_seconds(_KINDS[row["kind"]], n, hardware, fanouts)
        by_axis[axis] = by_axis.get(axis, 0.0) + seconds
    return by_axis


# causes of the once-per-step gradient sums and ZeRO gathers (`comm/collective_cause.py`)
_PER_STEP_CAUSES = ("grad sync of ", "optimizer ZeRO gather of ")


def _once_per_step(row: dict, data_axis) -> bool:
    """Whether a backward collective row is a gradient sum (or ZeRO gather) made once per step,
    after the schedule: on the data axis, or caused only by gradient syncs and ZeRO gathers on
    any axis (the non-expert parameters' sums over the expert axis, which also splits tokens)."""
    causes = row.get("causes") or {}
    return row["axis"] == data_axis or (bool(causes) and all(c.startswith(_PER_STEP_CAUSES) for c in causes))


def _stage_costs(stage: dict, data_axis, shape, names, hardware: Hardware):
    """One stage program's microbatch costs: (op seconds, forward collectives by axis, backward
    collectives other than the once-per-step gradient sums by axis, those sums by axis, FLOPs)."""
    ops = _compute_seconds(stage["compute"], hardware)
    fwd = _collective_seconds([r for r in stage["collectives"] if r["phase"] == "forward"], shape, names, hardware)
    bwd_rows = [r for r in stage["collectives"] if r["phase"] == "backward"]
    sync = _collective_seconds([r for r in bwd_rows if _once_per_step(r, data_axis)], shape, names, hardware)
    bwd = _collective_seconds([r for r in bwd_rows if not _once_per_step(r, data_axis)], shape, names, hardware)
    return ops, fwd, bwd, sync, sum(r["calls"] * r["flops"] for r in stage["compute"])


def predict_pipeline_step(mesh: dict, hardware: Hardware) -> StepPrediction:
    """The step time of a pipelined step (a report's mesh entry with a "pipeline" part): the
    schedule simulated (`schedule.simulation`) with each virtual stage's cost of one microbatch
    from its recorded ops and collectives, the activation sends' point-to-point latency between
    neighbouring pipeline ranks, and the data-parallel gradient sums once per step after it.

    A stage's forward costs its ops' roofline plus its forward collectives (tensor-parallel sums);
    its backward recomputes the forward (the pipeline's full recomputation) and differentiates it
    (twice the forward's ops), plus its backward collectives other than the data-parallel
    gradient sums: the full backward is 3 x the ops plus those collectives, split evenly between
    the input- and weight-gradient halves. A stage with device programs of their own (`programs`:
    its expert members under a routing histogram) costs its slowest program's: its members
    exchange rows every MoE layer, so each waits for the slowest (taken over the whole stage, a
    lower bound where different members are slowest in different layers). `flops` is one
    device's: the FLOPs of the stages its pipeline rank holds (forward, recompute and backward:
    3 x the forward's per microbatch), of the busiest rank.

    Raises:
        ValueError: a mesh group larger than the hardware's largest domain.
    """
    part = mesh["pipeline"]
    shape, names = mesh["shape"], mesh["dim_names"]
    data_axis = part.get("data_axis")
    forward, backward, grad_sync, by_axis, stage_flops_list = [], [], 0.0, {}, []
    num_virtual = part["stages"] * part["chunks"]
    for s in range(num_virtual):
        stage = part["per_stage"].get(str(s), {"compute": [], "collectives": []})
        # the stage's slowest device program (its expert members exchange every layer: they wait for
        # it), by its forward + backward: 4 x its ops plus its collectives
        ops, fwd, bwd, sync, stage_flops = max(
            (_stage_costs(program, data_axis, shape, names, hardware) for program in (stage, *stage.get("programs", ()))),
            key=lambda c: 4 * c[0] + sum(c[1].values()) + sum(c[2].values()))
        stage_flops_list.append(3 * part["microbatches"] * stage_flops)
        forward.append(ops + sum(fwd.values()))
        backward.append(3 * ops + sum(bwd.values()))
        grad_sync = max(grad_sync, sum(sync.values()))
        for table in (fwd, bwd):
            for axis, t in table.items():
                by_axis[axis] = by_axis.get(axis, 0.0) + t * part["microbatches"]
        for axis, t in sync.items():
            by_axis[axis] = by_axis.get(axis, 0.0) + t
    sends = [v for v in part["p2p"].values() if v["activation_count"]]
    send_bytes = max((v["activation_bytes"] / v["activation_count"] for v in sends), default=0.0)
    axis = list(names).index(part["axis"])
    stride = 1
    for n in shape[axis + 1:]:
        stride *= n
    latency = transfer_seconds(send_bytes, hardware, group_fanouts(hardware, 2, stride)) if sends else 0.0
    schedule = build_schedule(part["schedule"], part["stages"], part["microbatches"], part["chunks"])
    timeline = simulate_schedule(schedule, forward=forward, backward_input=[b / 2 for b in backward],
                                 backward_weight=[b / 2 for b in backward], p2p=latency)
    compute = timeline.makespan
    # one device's FLOPs: a device holds the virtual stages of its pipeline rank only; the
    # busiest rank's (every stage's FLOPs summed would count the whole pipeline's work)
    per_rank = [0.0] * part["stages"]
    for stage, rank in enumerate(schedule.stage_to_rank):
        per_rank[rank] += stage_flops_list[stage]
    flops = max(per_rank)
    notes = [f"{part['schedule']} over {part['stages']} pipeline ranks x {part['chunks']} chunk(s), "
             f"{part['microbatches']} microbatches, simulated with per-stage roofline costs (backward = "
             f"recompute + 2 x forward) and {latency * 1e6:.1f} us per activation send; bubble "
             f"{timeline.bubble_fraction:.1%}; data-parallel gradient sums once per step after the schedule"]
    if hardware.gemm_tiling is not None:
        notes.append(f"{hardware.name}'s GEMM tile and wave quantisation (gemm_tiling) not applied: the recorded ops "
                     "carry FLOPs and bytes, not GEMM shapes (each GEMM at the large-GEMM efficiency)")
    if hardware.validated:
        notes.append(f"{hardware.name}: {hardware.validated}")
    return StepPrediction(hardware.name, compute, grad_sync, flops, by_axis, notes)
