"""The StepReport of an MPMD model: its device groups' figures merged per global rank, with the
MPMD section (`MPMDSection`: per-group ranks and times, cross-group bytes, the group timeline,
the dynamic scheduler's decisions) inside it as `StepReport.mpmd`.

Each group runs its Cells as models on the group's own mesh; each such model reports its devices
(local ranks of the group's mesh). Here every figure is placed on the global rank the local rank
stands for: memory (bytes) summed over the group's Cells, communication rows kept per group (the
mesh axis named `axis@group`, as a pipeline names `axis@stageK`, with their causes), fallbacks
summed.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from mindspore_hyper.context import get_context
from mindspore_hyper.mpmd.group_timeline import GroupTimeline
from mindspore_hyper.mpmd.rebalancing import RebalanceRecord
from mindspore_hyper.runtime.report import StepReport

__all__ = ["MPMDSection", "mpmd_report"]


@dataclass
class MPMDSection:
    """What the last step did per group (the MPMD section of the model's StepReport).

    Attributes:
        groups: name -> {"ranks", "cells", "hardware", "scheduler", "forward_seconds", "mesh" (the
            group's own mesh: {"device_matrix", "alias_names"}), "parameters" (the group's rows of
            the job's StrategyTable, `ParamRow.to_dict()` each: tensor maps on the group's mesh,
            devices the global ranks)}.
        timeline: the per-group timeline of the last step (forward; with train_step, backward too).
        cross_group_bytes: (source group, target group) -> bytes of activations that crossed
            (the same bytes return as gradients in a training step); the source is
            "<between groups>" for tensors made by parameter-free code between groups.
        memory: global rank -> bytes the rank holds (parameters, gradients, optimizer states,
            activation peak) by its group's report (the StepReport's "total" column).
        rebalances: the decisions of the dynamic scheduler so far.
    """

    groups: Dict[str, Dict[str, Any]]
    timeline: GroupTimeline
    cross_group_bytes: Dict[Tuple[str, str], int]
    memory: Dict[int, int]
    rebalances: List[RebalanceRecord] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"groups": {n: {k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}
                           for n, g in self.groups.items()},
                "cross_group_bytes": {f"{s}->{d}": n for (s, d), n in self.cross_group_bytes.items()},
                "memory": dict(self.memory), "timeline": self.timeline.summary(),
                "rebalances": [r.plan.reason for r in self.rebalances]}

    def __str__(self) -> str:
        lines = ["MPMD groups:", "group            ranks            mesh                     parameters  forward s"]
        for name, g in self.groups.items():
            r = g["ranks"]
            text = f"{r[0]}-{r[-1]}" if list(r) == list(range(r[0], r[-1] + 1)) else ",".join(map(str, r))
            mesh = " x ".join(f"{a} {n}" for a, n in zip(g["mesh"]["alias_names"], g["mesh"]["device_matrix"]))
            lines.append(f"{name:<16} {text:<16} {mesh:<24} {len(g['parameters']):>10}  {g['forward_seconds']:.4f}")
        for (src, dst), n in self.cross_group_bytes.items():
            lines.append(f"{src} -> {dst}: {n} bytes")
        lines.append(str(self.timeline))
        return "\n".join(lines)


def mpmd_report(model, optimizer=None) -> StepReport:
    """See MPMDModel.report: the groups' reports merged per global rank, the MPMD section inside."""
    memory: Dict[int, Dict[str, int]] = {}
    by_dtype: Dict[int, Dict[str, Dict[str, int]]] = {}
    comm: Dict[str, Dict[str, Dict[str, int]]] = {}
    comm_backward: Dict[str, Dict[str, Dict[str, int]]] = {}
    causes: Dict[str, Dict[str, Dict[str, Dict[str, int]]]] = {}  # phase -> kind -> axis -> cause -> count
    fallbacks: Dict[str, int] = {}
    estimate, backward = 0.0, []
    for name, runner in model.runners.items():
        for cell_model in runner.models.values():
            mine = {id(p) for p in cell_model.network.trainable_params()}
            own = optimizer if optimizer is not None and any(id(p) in mine for p in optimizer.parameters) else None
            with warnings.catch_warnings():  # the merged report checks the budget once, per global rank
                warnings.simplefilter("ignore", ResourceWarning)
                rep = cell_model.report(own)
            for local, row in rep.memory.items():
                _add(memory.setdefault(runner.placement.ranks[local], {}), row)
            for local, kinds in rep.memory_by_dtype.items():
                target = by_dtype.setdefault(runner.placement.ranks[local], {})
                for kind, dtypes in kinds.items():
                    _add(target.setdefault(kind, {}), dtypes)
            for target, source in ((comm, rep.comm), (comm_backward, rep.comm_backward)):
                for kind, axes in source.items():
                    for axis, counts in axes.items():
                        _add(target.setdefault(kind, {}).setdefault(f"{axis}@{name}", {}), counts)
            for phase, kinds in rep.comm_causes.items():
                for kind, axes in kinds.items():
                    for axis, counts in axes.items():
                        _add(causes.setdefault(phase, {}).setdefault(kind, {}).setdefault(f"{axis}@{name}", {}),
                             counts)
            _add(fallbacks, rep.fallbacks)
            estimate += rep.comm_time_estimate_s
            backward.append(rep.backward_ran)
    norm = model.norm_sync.accounting  # the global norm's all-reduce over the job's mesh (not one group's)
    for (kind, axis), (count, nbytes, input_bytes) in norm.comm_backward.items():
        comm_backward.setdefault(kind, {})[axis] = {"count": count, "bytes": nbytes, "input_bytes": input_bytes}
    for (kind, axis), counts in norm.comm_backward_causes.items():
        causes.setdefault("backward", {}).setdefault(kind, {})[axis] = dict(counts)
    groups = {n: {"ranks": r.placement.ranks, "cells": r.placement.cells, "hardware": r.placement.group.hardware,
                  "scheduler": r.placement.group.scheduler, "forward_seconds": model.group_seconds[n],
                  "mesh": {"device_matrix": list(r.placement.strategy.mesh.device_matrix),
                           "alias_names": list(r.placement.strategy.mesh.alias_names)},
                  "parameters": {row.name: row.to_dict() for row in model.table.group_rows(n)}}
              for n, r in model.runners.items()}
    section = MPMDSection(groups, model.timeline, dict(model.cross_group_bytes),
                         {rank: row["total"] for rank, row in memory.items()}, list(model.rebalances))
    mesh = model.config.mesh
    report = StepReport(mesh=dict(zip(mesh.alias_names, mesh.device_matrix)), memory=dict(sorted(memory.items())),
                        comm=comm, comm_backward=comm_backward, fallbacks=fallbacks,
                        device_memory=get_context("device_memory"), step_seconds=model.last_step_seconds,
                        comm_time_estimate_s=estimate, simulated=model.runtime.in_one_process(),
                        backward_ran=_any_known(backward), memory_by_dtype=dict(sorted(by_dtype.items())),
                        comm_causes=causes, mpmd=section)
    report.notes.append(f"MPMD: {len(groups)} device groups, each on its own mesh (communication axes named "
                        f"axis@group; estimated time summed over the groups, no overlap); the per-group section is "
                        f"report.mpmd")
    report.check_memory()
    return report


def _add(target: Dict[str, int], source: Dict[str, int]) -> None:
    for key, value in source.items():
        target[key] = target.get(key, 0) + value


def _any_known(flags: List[Optional[bool]]) -> Optional[bool]:
    known = [f for f in flags if f is not None]
    return any(known) if known else None
