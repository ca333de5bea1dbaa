"""What a HyperParallel-API script cost each device: memory and collectives per mesh.

Every DTensor the API makes on a mesh counts in that mesh's accounting (`session`): the bytes
each device holds (its shard) while the DTensor lives, the peak of that, and every collective
with its mesh dimension and the bytes one device sends. Laid-out Parameters are counted apart
(each device's piece). The figures add up over the whole script. Models wrapped by
`auto_parallelize` are listed too, with their last step's figures.
"""
from __future__ import annotations

import math
from typing import Dict, List

from mindspore_hyper.context import get_context
from mindspore_hyper.hyper_parallel.api_step_memory import api_step_memory
from mindspore_hyper.hyper_parallel.session import job_ranks_of, session_executions
from mindspore_hyper.runtime.parallel_model import live_models
from mindspore_hyper.runtime.report import causes_text, device_groups, rank_ranges
from mindspore_hyper.units import format_bytes, format_seconds

__all__ = ["session_report", "format_report", "routing_text"]


def _accounting_rows(accounting) -> Dict:
    """Collectives (kind, axis, phase, count, bytes sent and input bytes per device, and what caused
    them: cause -> count, `comm/collective_cause.py`), the ops'
    work (FLOPs and bytes of one call on one device, and calls), the peak and the op it was
    reached in, and the memory timeline (per op: its name and the live bytes when it started)."""
    comm = [{"kind": kind, "axis": axis, "phase": phase, "count": count, "send_bytes_per_device": sent,
             "input_bytes_per_device": given, "causes": dict(sorted(causes.get((kind, axis), {}).items()))}
            for phase, table, causes in (("forward", accounting.comm, accounting.comm_causes),
                                         ("backward", accounting.comm_backward, accounting.comm_backward_causes))
            for (kind, axis), (count, sent, given) in sorted(table.items())]
    compute = [{"op": op, "flops": flops, "bytes": nbytes, "calls": calls}
               for (op, flops, nbytes), calls in sorted(accounting.compute.items())]
    return {"peak_bytes_per_device": accounting.peak_bytes, "peak_op": accounting.peak_op,
            "memory_timeline": [[op, live] for op, live in accounting.timeline],
            "live_bytes_per_device": accounting.live_bytes,
            "ops": sum(accounting.ops.values()), "replicated_fallbacks": dict(accounting.fallbacks),
            "collectives": comm, "compute": compute}


def _model_entry(model) -> Dict:
    """A wrapped model's last step: its mesh, memory parts per set of equal devices, collectives
    (the representative device's; `programs`: the devices with programs of their own, e.g. the
    expert members under a routing histogram, each with its collectives, peak and timeline)."""
    report = model.report()
    entry = {"source": f"{type(model.network).__name__} ({type(model).__name__})",
             "shape": list(model.mesh.device_matrix), "dim_names": list(model.mesh.alias_names),
             "training_step": bool(report.backward_ran),
             "memory_per_device": [{"devices": label, **parts} for label, parts in report.memory_groups()],
             "parameter_bytes_per_device": max(m["parameters"] for m in report.memory.values()),
             "step_memory": _step_memory_entry(report.step_memory), "offload": _offload_entry(report.offload)}
    entry.update(_accounting_rows(model.accounting))
    entry["programs"] = [{"devices": rank_ranges(sorted(ranks)), **_accounting_rows(variant)}
                         for ranks, variant in model.accounting.variants.items()]
    return entry


def _offload_entry(section):
    """A model's offload figures (`StepReport.offload`, offload/offload_section.py) per set of
    equal devices: modelled (`per_device`, equal in every mode), measured (`measured_per_device`:
    the simulation's stores; None in a dry run), the bytes taken off the memory rows per kind
    (`offloaded_per_device`) and the backward order (modelled, observed or None, whether they
    match); None for a model without offloaded units."""
    if section is None:
        return None
    measured = section["measured_per_device"]
    offloaded = {rank: {kind: sum(by_dtype.values()) for kind, by_dtype in kinds.items()}
                 for rank, kinds in section["offloaded"].items()}
    return {"block_size": section["block_size"], "device_budget_bytes": section["device_budget_bytes"],
            "per_device": [{"devices": label, **row} for label, row in device_groups(section["per_device"])],
            "measured_per_device": (None if measured is None else
                                    [{"devices": label, **row} for label, row in device_groups(measured)]),
            "offloaded_per_device": [{"devices": label, **row} for label, row in device_groups(offloaded)],
            "offloaded_parameters": list(section["offloaded_parameters"]),
            "backward_order": dict(section["backward_order"]), "backward_order_text": section["backward_order_text"]}


def _step_memory_entry(section):
    """A training step's memory over forward, backward and update (`StepReport.step_memory`):
    the series ([phase, op, activation bytes, gradient bytes]), its peak's phase and op (exact and
    with the allocator's rounding), the rounding and fragmentation used, and per set of equal
    devices the step peak exact, rounded and with the fragmentation allowance (a pipeline adds its
    series per pipeline rank: pipeline/pipeline_step_memory.py; a HyperParallel-API mesh the
    optimizer that ended its step: api_step_memory.py); None for a step without backward or a
    pipeline of plain-cell stages."""
    if section is None:
        return None
    entry = {k: v for k, v in section.items() if k != "per_device"}
    entry["per_device"] = [{"devices": label, **row} for label, row in device_groups(section["per_device"])]
    return entry


def _parameter_bytes(execution) -> int:
    """Bytes of laid-out parameters on the device holding the most: every device's when the layouts
    divide the shapes; with uneven (torch.chunk) pieces the real pieces of each device, summed,
    and the largest sum."""
    slots = list(execution.parameters.values())
    if all(slot.layout.is_even(slot.global_shape) for slot in slots):
        return sum(math.prod(slot.layout.local_shape(slot.global_shape)) * slot.param.dtype.itemsize for slot in slots)
    mesh = execution.mesh
    return max(sum(math.prod(slot.layout.shard_shape(slot.global_shape, mesh.coords(rank))) * slot.param.dtype.itemsize
                   for slot in slots) for rank in mesh.ranks)


def session_report(mode: str, devices: int) -> Dict:
    """The report as plain data (the `--json` schema, the same in every mode): mode, devices, and
    per mesh its shape, dimension names, the bytes of laid-out parameters each device holds, the
    per-device peak and live bytes of the other DTensors, collectives by (kind, dimension,
    phase) with their causes (cause -> count) and the ops' FLOPs and bytes; a model wrapped by `auto_parallelize` adds its memory
    parts (parameters, gradients, optimizer states, peak activations) per set of equal devices; a
    pipelined model its stages and schedule. `moe_routing` says how MoE routers chose experts
    (`routing_text`): a given histogram, balanced (a dry run's default: it has no logits; or with
    the `moe_routing` flag), else learned."""
    meshes: List[Dict] = []
    for execution in session_executions():
        params = _parameter_bytes(execution)
        ranks = job_ranks_of(execution)
        entry = {"source": "HyperParallel API", "shape": list(execution.mesh.device_matrix),
                 "dim_names": list(execution.mesh.alias_names), "ranks": list(ranks),
                 "parameter_bytes_per_device": params,
                 "step_memory": _step_memory_entry(api_step_memory(execution, ranks))}
        entry.update(_accounting_rows(execution.accounting))
        meshes.append(entry)
    models = live_models()
    shape_only = any(ex.shape_only for ex in session_executions()) or \
        any(not m.runtime.computes_values() for m in models)
    pipelines = [m for m in models if hasattr(m, "stage_models")]
    staged = {id(sm) for p in pipelines for sm in p.stage_models.values()}
    for model in models:
        if model in pipelines:
            if model.steps_run:
                meshes.append(_pipeline_entry(model))
        elif id(model) not in staged and model.accounting.steps:
            meshes.append(_model_entry(model))
    return {"mode": mode, "devices": devices, "meshes": meshes, "moe_routing": routing_text(shape_only)}


def routing_text(shape_only: bool) -> str:
    """How MoE routers chose experts, for the report: "learned", the balanced assumption (a dry
    run's default: it has no logits), or the given histogram, whose expert all-to-all and expert
    activations, exchange buffers and all-to-all bytes are each expert member's own."""
    routing = get_context("moe_routing")
    if isinstance(routing, tuple):
        shares = ", ".join(f"{f:g}" for f in routing)
        return (f"histogram: fractions [{shares}] of the token copies to experts 0..{len(routing) - 1}, every "
                "device's tokens alike; each expert member's devices with their own all-to-all bytes, expert "
                "activations and exchange buffers (a program of their own where they differ from rank 0's)")
    if shape_only or routing == "balanced":
        return "balanced: token t's j-th copy to expert (t k + j) mod E"
    return "learned"


def _pipeline_entry(model) -> Dict:
    """A pipelined model's last step: the whole mesh's memory rows (stage inputs in flight as its
    activations), every stage's collectives (axis "a@stageS") and the global gradient norm's
    all-reduce over the whole mesh, and per stage its ops' work and
    collectives of one microbatch plus the schedule (what the step-time model simulates)."""
    report = model.report()
    schedule = model.schedule
    stages = {s: _accounting_rows(sm.accounting) for s, sm in sorted(model.stage_models.items())}
    collectives = [dict(row, axis=f"{row['axis']}@stage{s}") for s, rows in stages.items()
                   for row in rows["collectives"]]
    collectives += _accounting_rows(model.norm_sync.accounting)["collectives"]  # the global norm's, whole mesh
    # (a stage's programs of their own, `_stage_programs`: the step-time model takes its slowest)
    over = type(next(iter(model.stage_models.values()))).__name__ if model.stage_models else "cells"
    entry = {"source": f"{type(model.network).__name__} (PipelineModel over {over})",
             "shape": list(model.mesh.device_matrix), "dim_names": list(model.mesh.alias_names),
             "training_step": True, "step_memory": _step_memory_entry(report.step_memory), "offload": None,
             "memory_per_device": [{"devices": label, **parts} for label, parts in report.memory_groups()],
             "parameter_bytes_per_device": max(m["parameters"] for m in report.memory.values()),
             "peak_bytes_per_device": max(m["activations_peak"] for m in report.memory.values()),
             "peak_op": "", "memory_timeline": [], "live_bytes_per_device": 0,
             "ops": sum(rows["ops"] for rows in stages.values()),
             "replicated_fallbacks": dict(report.fallbacks), "collectives": collectives,
             "compute": [row for rows in stages.values() for row in rows["compute"]],
             "pipeline": {"schedule": schedule.kind, "stages": schedule.num_stages,
                          "microbatches": schedule.num_microbatches, "chunks": schedule.num_chunks,
                          "axis": model.options.axis, "data_axis": model.strategy.data_axis,
                          "p2p": {k: dict(v) for k, v in report.p2p.items()},
                          "per_stage": {str(s): {"compute": rows["compute"], "collectives": rows["collectives"],
                                                 **_stage_programs(model.stage_models[s])}
                                        for s, rows in stages.items()}}}
    return entry


def _stage_programs(stage_model) -> Dict:
    """A stage's device programs of their own (an expert member under a routing histogram), each
    its devices, ops and collectives of one microbatch: {"programs": [...]}, or {} with none."""
    variants = stage_model.accounting.variants
    if not variants:
        return {}
    rows = {ranks: _accounting_rows(variant) for ranks, variant in variants.items()}
    return {"programs": [{"devices": rank_ranges(sorted(ranks)), "compute": r["compute"], "collectives": r["collectives"]}
                         for ranks, r in rows.items()]}


def format_report(report: Dict) -> str:
    """The report as text: one block per mesh."""
    lines = [f"mindspore-hyper: {report['mode']}, {report['devices']} devices"
             + (f"; MoE routers (if the model has any) route {report['moe_routing']}"
                if report.get("moe_routing", "learned") != "learned" else "")]
    if not report["meshes"]:
        lines.append("  no DTensor was made (the script used no device mesh)")
    for mesh in report["meshes"]:
        dims = " x ".join(f"{n}={s}" for n, s in zip(mesh["dim_names"], mesh["shape"]))
        ranks = mesh.get("ranks")
        on = f" on ranks {ranks}" if ranks is not None and ranks != list(range(report["devices"])) else ""
        lines.append(f"  mesh {dims}{on} ({mesh['source']}): laid-out parameters "
                     f"{format_bytes(mesh['parameter_bytes_per_device'])} per device; peak "
                     f"{format_bytes(mesh['peak_bytes_per_device'])} of other DTensors (activations, inputs)"
                     f"{' reached in ' + mesh['peak_op'] if mesh.get('peak_op') else ''}; "
                     f"{mesh['ops']} ops on DTensors")
        for row in mesh.get("memory_per_device", []):
            parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in row.items() if k != "devices")
            lines.append(f"    {_devices(row['devices'])}: {parts}")
        step = mesh.get("step_memory")
        by_rank = (step or {}).get("per_pipeline_rank")  # a pipeline: each pipeline rank's series has its own peak
        for rank, series in (by_rank or {}).items():
            lines.append(f"    pipeline rank {rank}: step memory peak in the {series['peak_phase']} of "
                         f"{series['peak_op']}")
        for row in (step or {}).get("per_device", []):
            at = "" if by_rank else f" in the {step['peak_phase']} of {step['peak_op']}"
            lines.append(f"    {_devices(row['devices'])}: step peak (forward, backward, update) "
                         f"{format_bytes(row['step_peak'])}{at}; "
                         f"{format_bytes(row['step_peak_rounded'])} with blocks rounded to {step['alignment_bytes']} "
                         f"bytes, {format_bytes(row['step_peak_with_fragmentation'])} with "
                         f"{step['fragmentation']:.0%} fragmentation")
        lines += _offload_text(mesh.get("offload"))
        if "predicted" in mesh:
            p = mesh["predicted"]
            lines.append(f"    predicted step on {p['hardware']}: {format_seconds(p['step_seconds'])} without overlap "
                         f"({format_seconds(p['compute_seconds'])} compute, {format_seconds(p['comm_seconds'])} "
                         f"collectives; {format_seconds(p['overlapped_seconds'])} if fully overlapped)"
                         + (f", the slowest program's: devices {p['slowest_devices']}" if p.get("slowest_devices") else ""))
        for row in mesh["collectives"]:
            lines.append(f"    {row['phase']:<8} {row['kind']:<13} over {row['axis']:<10} x{row['count']:<4} "
                         f"{format_bytes(row['send_bytes_per_device'])} sent per device"
                         + (f"; caused by {causes_text(row['causes'])}" if "causes" in row else ""))
        if mesh["replicated_fallbacks"]:
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(mesh["replicated_fallbacks"].items()))
            lines.append(f"    ran replicated (no sharding rule): {ops}")
    return "\n".join(lines)


def _offload_text(offload) -> List[str]:
    """A model's offload figures as text lines (none without offloaded units)."""
    if not offload:
        return []
    lines = []
    for row in offload["per_device"]:
        lines.append(f"    {_devices(row['devices'])}: offload stores {format_bytes(row['stored_bytes'])} "
                     f"(host tier {format_bytes(row['host_tier_bytes'])}, "
                     f"disk tier {format_bytes(row['disk_tier_bytes'])}); "
                     f"device tier pinned peak {format_bytes(row['device_tier_peak_pinned_bytes'])} "
                     f"(budget {format_bytes(offload['device_budget_bytes'])}), "
                     f"{format_bytes(row['device_loads_bytes'])} pinned onto it per step")
    for row in offload["measured_per_device"] or ():
        lines.append(f"    {_devices(row['devices'])}: offload measured in the last step: "
                     f"{format_bytes(row['bytes_to_device'])} to the device tier, "
                     f"{format_bytes(row['bytes_from_device'])} from it, prefetch {row['prefetch_hits']} hits, "
                     f"{row['prefetch_late']} late, {row['prefetch_misses']} misses")
    lines.append(f"    {offload['backward_order_text']}")
    return lines


def _devices(label: str) -> str:
    """A row's devices as text: "device 5", or "devices 0-3,8-11 (8)" for a group of equal ones."""
    return f"device {label}" if label.isdigit() else f"devices {label}"
