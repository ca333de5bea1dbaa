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

from mindspore_hyper.estimate.collective_time import collective_seconds, group_fanouts
from mindspore_hyper.estimate.hardware import Hardware

__all__ = ["StepPrediction", "predict_step"]

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
    eff = hardware.efficiency
    flop_rate = hardware.peak_flops * eff.matmul
    byte_rate = hardware.memory_bandwidth * eff.memory
    passes = 3 if training else 1
    compute = flops = 0.0
    for row in mesh["compute"]:
        calls = row["calls"] * passes
        compute += calls * (max(row["flops"] / flop_rate, row["bytes"] / byte_rate) + eff.op_overhead)
        flops += calls * row["flops"]
    by_axis: Dict[str, float] = {}
    for row in mesh["collectives"]:
        if row["kind"] not in _KINDS or row["count"] == 0:
            continue
        size, stride = _axis_group(mesh["shape"], mesh["dim_names"], row["axis"])
        per_call = row["input_bytes_per_device"] / row["count"]
        n = per_call * size if row["kind"] == "AllGather" else per_call
        seconds = row["count"] * collective_seconds(_KINDS[row["kind"]], n, hardware,
                                                    group_fanouts(hardware, size, stride))
        by_axis[row["axis"]] = by_axis.get(row["axis"], 0.0) + seconds
    notes = [f"roofline per op on {hardware.name} (matmul efficiency {eff.matmul:g}, memory {eff.memory:g})"
             + ("; backward = 2 x forward" if training else "") + "; collectives by the hierarchical alpha-beta "
             "model; no overlap in step_seconds"]
    if hardware.validated:
        notes.append(f"{hardware.name}: {hardware.validated}")
    return StepPrediction(hardware.name, compute, sum(by_axis.values()), flops, by_axis, notes)
