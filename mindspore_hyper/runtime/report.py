"""StepReport: what each device holds and sends in one step of a ParallelModel.

One row per device this process holds (every virtual device in simulation; its own device under
msrun). Memory per device (bytes): parameters and gradients (the parameter's shard size),
optimizer states (the real optimizer's state Parameters: at their ZeRO layout in simulation,
where they are global tensors, or their actual size under msrun, where each process holds its
own; `optimizer_states` per parameter when no optimizer is given), and peak live activations
tracked as DTensors are created and freed (each at its dtype's size); with mixed precision the
working weights (the compute-dtype copies MindSpore's amp casts the float32 masters to), and
`memory_by_dtype`: each kind's bytes by dtype (runtime/mixed_precision.py). Communication per
step: count and bytes sent per device, per collective kind and mesh axis, forward as planned and
backward as recorded when the gradients moved, with what caused them (`comm_causes`). Replication fallbacks by op name.
After a training step, `step_memory`: the memory over forward, backward and the optimizer update
(`runtime/step_memory.py`), its peak and the op at it, each device's step peak exact, with the
allocator's rounding (context flag `allocator_alignment`) and with a fragmentation allowance
(`allocator_fragmentation`).
With offloaded units (`hyper_offload` of the model), `offload`: the offload's figures per device
(`offload/offload_section.py`), and the memory rows count the offloaded parameters' parameter,
gradient and optimizer-state bytes only as the device tier holds them (`offload_device_tier`: its
peak of pinned blocks); the host and disk tiers are listed in the offload section.
Devices whose programs differ from the representative's (an expert member under a routing
assumption: `moe/member_loads.py`) have their own accounting (`Accounting.for_rank`): their rows
count their own peak activations and step series, and `programs` lists each such program's
devices and collectives (`comm_of(rank)`: a device's).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from mindspore_hyper.comm.collective_cause import UNATTRIBUTED
from mindspore_hyper.context import get_context
from mindspore_hyper.runtime.mixed_precision import memory_by_dtype
from mindspore_hyper.runtime.step_memory import round_block, step_memory
from mindspore_hyper.units import format_bytes as _fmt

__all__ = ["StepReport", "DeviceMemoryError", "device_groups", "rounded_model_states", "rank_ranges"]

KINDS = ("parameters", "gradients", "optimizer_states", "activations_peak")
COMM_TIME_MAX_DEVICES = 512  # larger meshes: no topology-model communication time (see `build`)


class DeviceMemoryError(MemoryError):
    """A virtual device needs more than `device_memory` (raised when memory_check='error')."""


@dataclass
class StepReport:
    """Figures of the last step; see module docstring for what each counts."""

    mesh: Dict[str, int]
    memory: Dict[int, Dict[str, int]]
    comm: Dict[str, Dict[str, Dict[str, int]]]
    comm_backward: Dict[str, Dict[str, Dict[str, int]]]
    fallbacks: Dict[str, int]
    device_memory: int
    step_seconds: float
    comm_time_estimate_s: float = 0.0
    notes: List[str] = field(default_factory=list)
    simulated: bool = True  # every device of the mesh simulated in this process (else: this process's own)
    pipeline: object = None  # PipelineModel: its section (pipeline/report.PipelineSection), else None
    backward_ran: Optional[bool] = None  # the last step's forward recorded gradients (None: not known)
    # rank -> "parameters" / "gradients" / "optimizer_states" / "working_weights" -> dtype -> bytes
    # (runtime/mixed_precision.memory_by_dtype); activations are counted at their own dtypes' sizes
    memory_by_dtype: Dict[int, Dict[str, Dict[str, int]]] = field(default_factory=dict)
    # "forward" / "backward" -> kind -> axis -> cause -> count: what caused each row's collectives
    # (the op and input redistributed, a parameter's grad sync, ...: comm/collective_cause.py)
    comm_causes: Dict[str, Dict[str, Dict[str, Dict[str, int]]]] = field(default_factory=dict)
    mpmd: object = None  # MPMD model: the per-group section (mpmd/mpmd_report.MPMDSection), else None
    # after a training step: the step's memory series and each device's step peak (see `_step_memory`)
    step_memory: Optional[dict] = None
    # with offloaded units: the offload's section (offload/offload_section.py), else None
    offload: Optional[dict] = None
    # the programs other than the representative's (devices with their own figures: `Accounting.variants`),
    # each {"ranks": [...], "comm": ..., "comm_backward": ..., "comm_causes": ...} as the fields above
    programs: List[dict] = field(default_factory=list)

    @classmethod
    def build(cls, model, optimizer=None) -> "StepReport":
        table, acc = model.table, model.accounting
        per = table.bytes_per_device()
        ranks = model.local_ranks
        simulated = model.runtime.name in ("simulation", "dryrun")  # parameters stay global tensors
        offload = model.offload.report_section(ranks) if getattr(model, "offload", None) is not None else None
        if offload is not None and optimizer is not None:
            raise ValueError("report(optimizer): the model's offloaded units are updated by the optimizers "
                             "hyper_offload made, whose states the offload section counts; call report() "
                             "without an optimizer")
        by_dtype = (_optimizer_bytes_by_dtype(table, optimizer, ranks, simulated, model.network,
                                              rows_by_id=getattr(model, "rows", None))
                    if optimizer is not None else None)
        optimizer_bytes = {r: sum(v.values()) for r, v in by_dtype.items()} if by_dtype is not None else None
        memory = {}
        for rank in ranks:
            memory[rank] = {
                "parameters": per[rank]["param"],
                "gradients": per[rank]["param"],
                "optimizer_states": optimizer_bytes[rank] if optimizer_bytes is not None else per[rank]["optimizer"],
                "activations_peak": acc.for_rank(rank).peak_bytes,
            }
        by_kind_dtype = memory_by_dtype(table, ranks, by_dtype, model.network)
        if offload is not None:
            _take_offloaded(memory, by_kind_dtype, offload)
        for rank in ranks:
            working = sum(by_kind_dtype[rank]["working_weights"].values())
            if working:  # mixed precision: compute-dtype copies of the weights, cast inside MindSpore's kernels
                memory[rank]["working_weights"] = working
            memory[rank]["total"] = sum(memory[rank][k] for k in KINDS) + working + \
                memory[rank].get("offload_device_tier", 0)
        report = cls(
            mesh=dict(zip(table.mesh.alias_names, table.mesh.device_matrix)),
            memory=memory, comm=_nest(acc.comm), comm_backward=_nest(acc.comm_backward),
            fallbacks=dict(acc.fallbacks),
            device_memory=get_context("device_memory"), step_seconds=model.last_step_seconds,
            simulated=simulated, backward_ran=getattr(model, "last_forward_recorded_gradients", None),
            memory_by_dtype=by_kind_dtype,
            comm_causes={"forward": _nest_causes(acc.comm_causes), "backward": _nest_causes(acc.comm_backward_causes)},
            offload=offload,
            programs=_programs(acc, memory),
        )
        if table.mesh.size <= COMM_TIME_MAX_DEVICES:
            report.comm_time_estimate_s = _comm_time(report, table.mesh)
        else:
            report.comm_time_estimate_s = float("nan")
            report.notes.append(f"communication time not estimated on {table.mesh.size} devices (the topology cost "
                                f"model chooses algorithms on the whole device graph, seconds per collective above "
                                f"{COMM_TIME_MAX_DEVICES}); `mindspore-hyper dryrun --hardware PRESET` predicts it")
        if report.backward_ran:
            report.step_memory = _step_memory(model, optimizer, memory, ranks, simulated, offload)
        report.check_memory()
        return report

    def comm_of(self, rank: int) -> Dict[str, dict]:
        """Device `rank`'s collectives: {"comm", "comm_backward", "comm_causes"} (its program's)."""
        for program in self.programs:
            if rank in program["ranks"]:
                return {k: program[k] for k in ("comm", "comm_backward", "comm_causes")}
        return {"comm": self.comm, "comm_backward": self.comm_backward, "comm_causes": self.comm_causes}

    @property
    def p2p(self) -> Dict[str, Dict[str, int]]:
        """The pipeline section's stage boundary -> send counts/bytes per step ({} without one)."""
        return self.pipeline.p2p if self.pipeline is not None else {}

    @property
    def timeline(self):
        """The pipeline section's schedule timeline with measured per-stage costs (None without one)."""
        return self.pipeline.timeline if self.pipeline is not None else None

    # -- checks ------------------------------------------------------------------------------
    def over_budget(self) -> Dict[int, int]:
        """rank -> total bytes, for the devices above `device_memory`."""
        return {r: m["total"] for r, m in self.memory.items() if m["total"] > self.device_memory}

    def check_memory(self) -> None:
        """Warn or raise (context flag memory_check) if a device exceeds device_memory."""
        over = self.over_budget()
        if not over:
            return
        rank, total = max(over.items(), key=lambda kv: kv[1])
        message = (f"{len(over)} virtual device(s) exceed device_memory={_fmt(self.device_memory)}: "
                   f"device {rank} needs {_fmt(total)} ({', '.join(f'{k} {_fmt(v)}' for k, v in self.memory[rank].items() if k != 'total')})")
        if get_context("memory_check") == "error":
            raise DeviceMemoryError(message)
        warnings.warn(message, ResourceWarning, stacklevel=3)
        self.notes.append(message)

    # -- output ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "mesh": dict(self.mesh), "memory": {r: dict(m) for r, m in self.memory.items()},
            "comm": {k: {a: dict(v) for a, v in axes.items()} for k, axes in self.comm.items()},
            "comm_backward": {k: {a: dict(v) for a, v in axes.items()} for k, axes in self.comm_backward.items()},
            "fallbacks": dict(self.fallbacks), "device_memory": self.device_memory,
            "step_seconds": self.step_seconds, "comm_time_estimate_s": self.comm_time_estimate_s,
            "notes": list(self.notes), "p2p": {k: dict(v) for k, v in self.p2p.items()},
            "memory_by_dtype": {r: {k: dict(v) for k, v in m.items()} for r, m in self.memory_by_dtype.items()},
            "comm_causes": {p: {k: {a: dict(c) for a, c in axes.items()} for k, axes in kinds.items()}
                            for p, kinds in self.comm_causes.items()},
            **({"mpmd": self.mpmd.to_dict()} if self.mpmd is not None else {}),
            **({"step_memory": self.step_memory} if self.step_memory is not None else {}),
            **({"pipeline": self.pipeline.to_dict()} if self.pipeline is not None else {}),
            **({"offload": self.offload} if self.offload is not None else {}),
            **({"programs": [dict(p) for p in self.programs]} if self.programs else {}),
        }

    def __str__(self) -> str:
        who = f"{len(self.memory)} virtual devices" if self.simulated else f"device {list(self.memory)[0]} of this process"
        lines = [f"{'Simulated step' if self.simulated else 'Step'} on mesh {self.mesh} ({who}), "
                 f"wall time {self.step_seconds * 1e3:.1f} ms"]
        head = ["device", "parameters", "gradients", "optimizer", "activations(peak)", "total", "budget"]
        rows = [[label, _fmt(m["parameters"]), _fmt(m["gradients"]), _fmt(m["optimizer_states"]),
                 _fmt(m["activations_peak"]), _fmt(m["total"]),
                 "OVER" if m["total"] > self.device_memory else "ok"] for label, m in self.memory_groups()]
        if any("working_weights" in m for m in self.memory.values()):  # mixed precision
            head.insert(5, "working weights")
            for row, (_, m) in zip(rows, self.memory_groups()):
                row.insert(5, _fmt(m.get("working_weights", 0)))
        if any("offload_device_tier" in m for m in self.memory.values()):
            head.insert(-2, "offload tier")
            for row, (_, m) in zip(rows, self.memory_groups()):
                row.insert(-2, _fmt(m.get("offload_device_tier", 0)))
        lines += _table(head, rows)
        lines += self._offload_lines()
        lines += self._dtype_lines()
        lines += self._step_memory_lines()
        crow = [[phase, kind, axis, str(v["count"]), _fmt(v["bytes"]),
                 causes_text(self.comm_causes.get(phase, {}).get(kind, {}).get(axis, {}))]
                for phase, comm in (("forward", self.comm), ("backward", self.comm_backward))
                for kind, axes in comm.items() for axis, v in axes.items()]
        if crow and self.programs:
            rest = sorted(set(self.memory) - {r for p in self.programs for r in p["ranks"]})
            lines.append(f"devices {rank_ranges(rest)}:")
        if crow:
            lines.append("communication per step (bytes sent per device):")
            lines += _table(["phase", "collective", "axis", "count", "bytes", "caused by"], crow, left_last=True)
            lines.append(self._backward_note())
            if not math.isnan(self.comm_time_estimate_s):
                lines.append(f"estimated communication time per step: {self.comm_time_estimate_s * 1e3:.3f} ms "
                             f"(alpha-beta, topology {get_context('topology')!r}, no overlap)")
        else:
            lines.append("communication per step: none" + (" (the last step ran no backward pass)"
                                                           if self.backward_ran is False else ""))
        lines += _program_lines(self)
        if self.pipeline is not None:
            lines.append(str(self.pipeline))
        if self.mpmd is not None:
            lines.append(str(self.mpmd))
        if self.fallbacks:
            lines.append("replication fallbacks (op: count): " +
                         ", ".join(f"{k}: {v}" for k, v in sorted(self.fallbacks.items())))
        lines += self.notes
        return "\n".join(lines)

    def _offload_lines(self) -> List[str]:
        """The offload section as text: per set of equal devices the modelled figures, then the
        measured ones (simulation), then the backward order."""
        section = self.offload
        if section is None:
            return []
        lines = [f"offloaded units (blocks of {_fmt(section['block_size'])}, device tier budget "
                 f"{_fmt(section['device_budget_bytes'])}; 'offload tier' above: its peak of pinned blocks, in "
                 "place of the offloaded parameters, gradients and optimizer states):"]
        rows = [[label, _fmt(m["stored_bytes"]), _fmt(m["device_tier_peak_pinned_bytes"]),
                 _fmt(m["peak_materialized_bytes"]), _fmt(m["host_tier_bytes"]), _fmt(m["disk_tier_bytes"]),
                 _fmt(m["device_loads_bytes"])] for label, m in device_groups(section["per_device"])]
        lines += _table(["device", "stored", "tier pinned(peak)", "materialized(peak)", "host tier", "disk tier",
                         "loads/step"], rows)
        measured = section["measured_per_device"]
        if measured is None:
            lines.append("  measured copies and prefetches: none in a dry run (no copies run); 'loads/step' is the "
                         "bytes pinned onto the tier per step if its cache never kept a block")
        else:
            rows = [[label, _fmt(m["bytes_to_device"]), _fmt(m["bytes_from_device"]), _fmt(m["bytes_host_to_disk"]),
                     f"{m['prefetch_hits']}/{m['prefetch_late']}/{m['prefetch_misses']}",
                     _fmt(m["device_tier_peak_bytes"]), _fmt(m["host_tier_bytes"]), _fmt(m["disk_tier_bytes"])]
                    for label, m in device_groups(measured)]
            lines.append("  measured in the last step (the stores' copies; tiers now, device tier peak since made):")
            lines += ["  " + line for line in _table(
                ["device", "to device", "from device", "host->disk", "prefetch hit/late/miss", "tier peak",
                 "host tier", "disk tier"], rows)]
        lines.append("  " + section["backward_order_text"])
        return lines

    def _dtype_lines(self) -> List[str]:
        """Bytes by dtype of the first device (every device of a symmetric mesh alike), when the
        model holds more than one dtype or casts weights (mixed precision)."""
        if not self.memory_by_dtype:
            return []
        rank, by = next(iter(self.memory_by_dtype.items()))
        dtypes = {d for kind in by.values() for d in kind}
        if len(dtypes) < 2 and not by.get("working_weights"):
            return []
        parts = [f"{kind.replace('_', ' ')} " + " + ".join(f"{_fmt(n)} {d}" for d, n in sorted(v.items()))
                 for kind, v in by.items() if v]
        return [f"by dtype (device {rank}): " + "; ".join(parts) +
                " (working weights: the compute-dtype copies of the masters that mixed precision casts; "
                "activations counted at their own dtypes)"]

    def _step_memory_lines(self) -> List[str]:
        """The step peak over forward, backward and update of the first device with the highest
        (`step_memory`; a pipeline's section gives the series of that device's pipeline rank)."""
        step = self.step_memory
        if not step or not step["per_device"]:
            return []
        rank, row = max(step["per_device"].items(), key=lambda kv: kv[1]["step_peak"])
        return [f"step peak (forward, backward, update; device {rank}): {_fmt(row['step_peak'])} in the "
                f"{step['peak_phase']} of {step['peak_op']}; {_fmt(row['step_peak_rounded'])} with blocks rounded to "
                f"{step['alignment_bytes']} bytes, {_fmt(row['step_peak_with_fragmentation'])} with "
                f"{step['fragmentation']:.0%} fragmentation"]

    def _backward_note(self) -> str:
        """The line under the communication table: what the backward rows mean for this step."""
        if self.backward_ran is False:
            return "  backward: none, the last step was a forward without gradients (no backward pass ran)"
        if self.backward_ran and not self.comm_backward:
            return "  backward: a backward pass ran and moved no gradient between devices"
        return "  backward: recorded when the gradients moved"

    def memory_groups(self):
        """(label, memory row) per set of devices with equal memory figures ("0-47 (48)"; a device
        alone: its rank), so 8 or 384 equal devices read as one line."""
        return device_groups(self.memory)

    def plot(self, path: str) -> str:
        """Save a PNG: per-device memory as stacked bars, and bytes per collective kind/axis."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        groups = self.memory_groups()
        bottom = np.zeros(len(groups))
        extra = tuple(k for k in ("working_weights", "offload_device_tier") if any(k in m for _, m in groups))
        for kind in KINDS + extra:
            values = np.array([m.get(kind, 0) for _, m in groups], dtype=float) / 2**20
            left.bar([label for label, _ in groups], values, bottom=bottom, label=kind)
            bottom += values
        top = max(bottom.max(), 1e-9) * 1.3
        if self.device_memory / 2**20 <= top:
            left.axhline(self.device_memory / 2**20, color="red", linestyle="--", label="device_memory")
        left.set_ylim(0, top)
        left.set_xlabel("virtual device" if len(groups) == len(self.memory) else "virtual devices (count)")
        left.tick_params(axis="x", labelsize=7)
        left.set_ylabel("MiB")
        left.set_title(f"memory per device (budget {_fmt(self.device_memory)})")
        left.legend(fontsize=8)
        phases = (("fwd", self.comm), ("bwd", self.comm_backward))
        labels = [f"{p} {k} / {a}" for p, comm in phases for k, axes in comm.items() for a in axes]
        values = [v["bytes"] / 2**20 for _, comm in phases for axes in comm.values() for v in axes.values()]
        right.barh(labels or ["none"], values or [0])
        right.invert_yaxis()
        right.set_xlabel("MiB sent per device per step")
        right.set_title(f"communication by phase, collective and mesh axis\n(estimated {self.comm_time_estimate_s * 1e3:.2f} "
                        f"ms/step, topology {get_context('topology')!r}, no overlap)", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def _programs(acc, memory) -> List[dict]:
    """`StepReport.programs`: per variant of the accounting, its devices (of `memory`'s) and collectives."""
    return [{"ranks": sorted(r for r in ranks if r in memory), "comm": _nest(v.comm),
             "comm_backward": _nest(v.comm_backward),
             "comm_causes": {"forward": _nest_causes(v.comm_causes), "backward": _nest_causes(v.comm_backward_causes)}}
            for ranks, v in acc.variants.items()]


def _program_lines(report: "StepReport") -> List[str]:
    """Per program of its own (`StepReport.programs`): its devices and the collectives that differ
    from the representative's."""
    lines = []
    for program in report.programs:
        differ = [[phase, kind, axis, str(v["count"]), _fmt(v["bytes"])]
                  for phase, comm, own in (("forward", report.comm, program["comm"]),
                                           ("backward", report.comm_backward, program["comm_backward"]))
                  for kind, axes in own.items() for axis, v in axes.items() if comm.get(kind, {}).get(axis) != v]
        lines.append(f"devices {rank_ranges(program['ranks'])}: their own program, collectives that differ:")
        lines += _table(["phase", "collective", "axis", "count", "bytes"], differ)
    return lines


def device_groups(rows: Dict[int, Dict[str, int]]):
    """(label, row) per set of devices with equal rows, in order of their first device, at any
    number of devices: a group's label is its ranges and count ("0-3,8-11 (8)"), a device alone
    its rank ("5"); a row keeps its keys' order."""
    groups: Dict[tuple, List[int]] = {}
    first: Dict[tuple, Dict[str, int]] = {}
    for rank, m in rows.items():
        key = tuple(sorted(m.items()))
        groups.setdefault(key, []).append(rank)
        first.setdefault(key, m)
    return [(f"{rank_ranges(ranks)} ({len(ranks)})" if len(ranks) > 1 else str(ranks[0]), dict(first[key]))
            for key, ranks in groups.items()]


def rank_ranges(ranks: List[int]) -> str:
    """Ranks as compact ranges: [0, 1, 2, 5] -> "0-2,5"."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(parts)


def _optimizer_bytes_by_dtype(table, optimizer, ranks, simulated: bool = True, network=None, alignment: int = 1,
                              rows_by_id=None) -> Dict[int, Dict[str, int]]:
    """rank -> state dtype ("float32") -> bytes of the optimizer's per-parameter states. A state Parameter is
    matched to its parameter by name suffix (the table's name, or the name of a model Parameter the
    optimizer updates: `rows_by_id`, id(Parameter) -> its row, the model's `rows`); in simulation, where states are global tensors, a
    global-shaped state counts at the parameter's optimizer layout; under msrun every state
    counts at its actual size (what this process really holds, even when a shard has the
    global shape, as a replicated parameter's does)."""
    per_rank: Dict[int, Dict[str, int]] = {rank: {} for rank in ranks}
    rows = {row.name: row for row in table}
    if network is not None:  # a state is named after its Parameter's own name, which a wrapper Cell
        # (MindSpore's amp O2/O3 `_OutputTo32`) leaves as it was while the table's path grows a prefix
        rows.update({p.name: rows[path] for path, p in network.parameters_and_names() if path in rows})
    for p in optimizer.parameters if rows_by_id else ():  # a Parameter the model made for itself (a pipeline
        # stage's shards under msrun, named within its stage) names its states after its own name
        if id(p) in rows_by_id:
            rows.setdefault(p.name, rows_by_id[id(p)])
    updated = {id(p) for p in optimizer.parameters}  # not states (a Cell's table names its own relative to
    # the Cell: "text_encoder.0.weight" would read as a state "text_encoder" of "0.weight")
    for _, state in optimizer.parameters_and_names():
        prefix, _, pname = state.name.partition(".")
        row = rows.get(pname)
        if row is None or pname == state.name or id(state) in updated:
            continue
        if simulated and tuple(state.shape) == row.global_shape:
            nbytes = math.prod(row.optimizer_layout.local_shape(row.global_shape)) * state.dtype.itemsize
        else:
            nbytes = math.prod(state.shape) * state.dtype.itemsize
        nbytes = round_block(nbytes, alignment)  # alignment > 1: each state as the allocator rounds it
        for rank in ranks:
            if rank in row.devices:
                dtype = str(state.dtype).lower()
                per_rank[rank][dtype] = per_rank[rank].get(dtype, 0) + nbytes
    return per_rank


def _step_memory(model, optimizer, memory, ranks, simulated: bool, offload: Optional[dict] = None) -> dict:
    """The step's memory section: the series of the representative device (`step_memory`: every
    device of the SPMD program alike) exact and with every block rounded to the context's
    `allocator_alignment`, its peak and the op at it, and per device the step peak = parameters +
    optimizer states + working weights (alive throughout) + the series' peak, exact, rounded
    (parameters and optimizer states rounded per parameter and state; working weights as they
    are), and rounded x (1 + `allocator_fragmentation`) rounded up to a byte. With an `offload`
    section the offloaded parameters count as the device tier's pinned peak (whole blocks)."""
    alignment, fragmentation = get_context("allocator_alignment"), get_context("allocator_fragmentation")
    trainable = {id(p) for p in model.network.trainable_params()}
    acc = model.accounting
    series = {id(a): tuple(step_memory(a, n, trainable) for n in (1, alignment))
              for a in (acc, *acc.variants.values())}  # each program's (exact, rounded)
    exact, rounded = series[id(acc)]
    if not exact.points:
        return {"timeline": [], "peak_phase": "", "peak_op": "", "alignment_bytes": alignment,
                "fragmentation": fragmentation, "per_device": {}}
    offloaded = set(offload["offloaded_parameters"]) if offload is not None else ()
    states = rounded_model_states(model, optimizer, ranks, simulated, alignment, skip=offloaded)
    per_device = {}
    for rank in ranks:
        m = memory[rank]
        own_exact, own_rounded = series[id(acc.for_rank(rank))]
        working = m.get("working_weights", 0) + m.get("offload_device_tier", 0)  # (the tier: whole blocks)
        step_rounded = states[rank] + working + own_rounded.peak.total
        per_device[rank] = {
            "step_peak": m["parameters"] + m["optimizer_states"] + working + own_exact.peak.total,
            "step_peak_rounded": step_rounded,
            "step_peak_with_fragmentation": math.ceil(step_rounded * (1 + fragmentation)),
        }
    programs = [{"ranks": sorted(r for r in ranks_of if r in memory), "timeline": series[id(v)][0].to_rows(),
                 "peak_phase": series[id(v)][0].peak.phase, "peak_op": series[id(v)][0].peak.op}
                for ranks_of, v in acc.variants.items()]
    return {"timeline": exact.to_rows(), "peak_phase": exact.peak.phase, "peak_op": exact.peak.op,
            "rounded_peak_phase": rounded.peak.phase, "rounded_peak_op": rounded.peak.op,
            "alignment_bytes": alignment, "fragmentation": fragmentation, "per_device": per_device,
            **({"programs": programs} if programs else {})}


def rounded_model_states(model, optimizer, ranks, simulated: bool, alignment: int, skip=()) -> Dict[int, int]:
    """rank -> bytes of `model`'s parameters and optimizer states on it, each parameter and each
    state a block rounded up to `alignment` bytes (without an optimizer: each parameter's states
    as one block). `simulated`: states are global tensors counted at their ZeRO layout (see
    `_optimizer_bytes_by_dtype`). `skip`: names of parameters left out (offloaded: the device
    tier holds them)."""
    table = [row for row in model.table if row.name not in skip]
    params = {rank: 0 for rank in ranks}
    for row in table:
        for rank in row.devices:
            if rank in params:
                params[rank] += round_block(row.param_bytes, alignment)
    if optimizer is not None:
        states = {r: sum(v.values()) for r, v in _optimizer_bytes_by_dtype(
            table, optimizer, ranks, simulated, model.network, alignment, getattr(model, "rows", None)).items()}
    else:  # each parameter's states as one block
        states = {rank: sum(round_block(row.optimizer_bytes, alignment) for row in table if rank in row.devices)
                  for rank in ranks}
    return {rank: params[rank] + states[rank] for rank in ranks}


def _take_offloaded(memory, by_kind_dtype, section) -> None:
    """Moves the offloaded parameters' bytes out of the memory rows (and the by-dtype figures):
    the device holds them only as its offload tier's pinned blocks (`offload_device_tier`)."""
    for rank, row in memory.items():
        for kind, by_dtype in section["offloaded"][rank].items():
            for dtype, nbytes in by_dtype.items():
                row[kind] -= nbytes
                left = by_kind_dtype[rank][kind].get(dtype, 0) - nbytes
                if left:
                    by_kind_dtype[rank][kind][dtype] = left
                else:
                    by_kind_dtype[rank][kind].pop(dtype, None)
        row["offload_device_tier"] = section["per_device"][rank]["device_tier_peak_pinned_bytes"]


def _comm_time(report: "StepReport", mesh) -> float:
    from mindspore_hyper.comm.cost import collective_time

    total = 0.0
    for comm in (report.comm, report.comm_backward):
        for kind, axes in comm.items():
            for axis, v in axes.items():
                group = mesh.axis_groups(axis.split("+"))[0]
                total += v["count"] * collective_time(kind, v["input_bytes"] // v["count"], group)
    return total


def _nest_causes(flat) -> Dict[str, Dict[str, Dict[str, int]]]:
    """(kind, axis) -> Counter of causes, as kind -> axis -> cause -> count."""
    out: Dict[str, Dict[str, Dict[str, int]]] = {}
    for (kind, axis), causes in sorted(flat.items()):
        out.setdefault(kind, {})[axis] = dict(sorted(causes.items()))
    return out


_LISTED = ("grad sync of ", "optimizer ZeRO gather of ")  # causes that name parameters: listed together


def causes_text(causes: Dict[str, int], shown: int = 3) -> str:
    """One row's causes as text, most frequent first: "redistribute for MatMul input 1 in fc1 x2;
    grad sync of fc1.weight, fc2.weight (+5 more)"; a cause recorded without one reads
    "not attributed". Parameter-naming causes are merged into one list per kind; at most `shown`
    other causes or names each, then how many more."""
    names: Dict[str, List[str]] = {}
    others = []
    for cause, count in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])):
        prefix = next((p for p in _LISTED if cause.startswith(p)), None)
        if prefix is not None:
            names.setdefault(prefix, []).extend(cause[len(prefix):].split(", "))
        else:
            others.append((cause or UNATTRIBUTED) + (f" x{count}" if count > 1 else ""))
    parts = [prefix + ", ".join(listed[:shown]) + (f" (+{len(listed) - shown} more)" if len(listed) > shown else "")
             for prefix, listed in names.items()]
    parts += others[:shown] + ([f"+{len(others) - shown} more causes"] if len(others) > shown else [])
    return "; ".join(parts)


def _nest(flat) -> Dict[str, Dict[str, Dict[str, int]]]:
    out: Dict[str, Dict[str, Dict[str, int]]] = {}
    for (kind, axis), (count, nbytes, input_bytes) in sorted(flat.items()):
        out.setdefault(kind, {})[axis] = {"count": count, "bytes": nbytes, "input_bytes": input_bytes}
    return out


def _table(head, rows, left_last: bool = False) -> List[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join("{:>%d}" % w for w in widths)
    if left_last:  # a text column (causes): left-aligned
        fmt = fmt[:fmt.rindex("{")] + "{}"
    
    return [fmt.format(*head)] + [fmt.format(*r) for r in rows]
