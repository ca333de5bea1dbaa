"""What a HyperParallel-API script cost each device: memory and collectives per mesh.

Every DTensor the API makes on a mesh counts in that mesh's accounting (`session`): the bytes
each device holds (its shard) while the DTensor lives, the peak of that, and every collective
with its mesh dimension and the bytes one device sends. Laid-out Parameters are counted apart
(each device's piece). The figures add up over the whole script.
"""
from __future__ import annotations

import math
from typing import Dict, List

from mindspore_hyper.hyper_parallel.session import session_executions
from mindspore_hyper.units import format_bytes

__all__ = ["session_report", "format_report"]


def session_report(mode: str, devices: int) -> Dict:
    """The report as plain data (the `--json` schema): mode, devices, and per mesh its shape,
    dimension names, the bytes of laid-out parameters each device holds, the per-device peak and
    live bytes of the other DTensors, and collectives by (kind, dimension, phase)."""
    meshes: List[Dict] = []
    for execution in session_executions():
        accounting = execution.accounting
        comm = [{"kind": kind, "axis": axis, "phase": phase, "count": count, "send_bytes_per_device": sent}
                for phase, table in (("forward", accounting.comm), ("backward", accounting.comm_backward))
                for (kind, axis), (count, sent, _) in sorted(table.items())]
        params = sum(math.prod(slot.layout.local_shape(slot.global_shape)) * slot.param.dtype.itemsize
                     for slot in execution.parameters.values())
        meshes.append({"shape": list(execution.mesh.device_matrix), "dim_names": list(execution.mesh.alias_names),
                       "parameter_bytes_per_device": params,
                       "peak_bytes_per_device": accounting.peak_bytes, "live_bytes_per_device": accounting.live_bytes,
                       "ops": sum(accounting.ops.values()), "replicated_fallbacks": dict(accounting.fallbacks),
                       "collectives": comm})
    return {"mode": mode, "devices": devices, "meshes": meshes}


def format_report(report: Dict) -> str:
    """The report as text: one block per mesh."""
    lines = [f"mindspore-hyper run: {report['mode']}, {report['devices']} devices"]
    if not report["meshes"]:
        lines.append("  no DTensor was made (the script used no device mesh)")
    for mesh in report["meshes"]:
        dims = " x ".join(f"{n}={s}" for n, s in zip(mesh["dim_names"], mesh["shape"]))
        lines.append(f"  mesh {dims}: laid-out parameters {format_bytes(mesh['parameter_bytes_per_device'])} per device; "
                     f"peak {format_bytes(mesh['peak_bytes_per_device'])} of other DTensors (activations, inputs); "
                     f"{mesh['ops']} ops on DTensors")
        for row in mesh["collectives"]:
            lines.append(f"    {row['phase']:<8} {row['kind']:<13} over {row['axis']:<10} x{row['count']:<4} "
                         f"{format_bytes(row['send_bytes_per_device'])} sent per device")
        if mesh["replicated_fallbacks"]:
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(mesh["replicated_fallbacks"].items()))
            lines.append(f"    ran replicated (no sharding rule): {ops}")
    return "\n".join(lines)
