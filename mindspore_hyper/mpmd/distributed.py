"""MPMD groups under msrun: each process belongs to one device group and runs only its Cells.

A group runs its Cells as a `DistributedModel` on the group's own mesh (its ranks renumbered
0..n-1 by the group's `SubWorld`, collectives over communicators of the group's global ranks).
The model's code between groups runs in every process on global tensors; a group's output is
sent by its leader to the processes outside the group (`RemoteGroupOutput` there), and the
gradient of its inputs travels back the same way (`SendInputGradient` / `RecvInputGradient`),
see `cross_group.py`. Each process's optimizer updates its own group's parameters.
"""
from __future__ import annotations

import contextlib
import time
from typing import Dict, Iterator, List, Optional, Tuple

import mindspore as ms
from mindspore import Parameter, Tensor

from mindspore_hyper.runtime.distributed.runtime import DistributedRuntime
from mindspore_hyper.runtime.distributed.world import world
from mindspore_hyper.mpmd.cross_group import (RecvInputGradient, RemoteGroupOutput, SendInputGradient,
                                             outbox, send_output)
from mindspore_hyper.mpmd.group_runner import GroupRunner
from mindspore_hyper.mpmd.group_placement import GroupPlacement

__all__ = ["DistributedGroupRunner", "MemberGroupRunner", "parallelize_groups",
           "check_group_process"]


class DistributedGroupRunner(GroupRunner):
    """A group's Cells in one msrun process: run for real by members, received by the others.

    A Cell called once per step on the model's own inputs only (an encoder reading the raw
    batch) is run by its members at the start of the forward (`begin_step`), before the code
    between groups, and its output is sent at once; so groups that read only the batch compute
    at the same time in their processes instead of in the model's program order. The members
    learn which Cells qualify from the first step (the same in every process).

    Attributes:
        member: whether this process belongs to the group.
        leader: the group's first global rank (sends outputs and input gradients).
        events: ("forward" | "receive", cell, start, end) wall-clock seconds (time.time) of this
            process's member calls and of its waits for the group's outputs.
    """

    def __init__(self, network, placement: GroupPlacement, runtime, table, on_call=None):
        w = world()
        self.member = w.rank in placement.ranks
        self.leader = placement.ranks[0]
        self.outside = tuple(r for r in range(w.size) if r not in placement.ranks)
        self.events: List[Tuple[str, str, float, float]] = []
        self._raw_positions: Dict[str, Optional[Tuple[int, ...]]] = {}  # Cell -> input positions (None: not raw)
        self._order: List[str] = []  # the group's Cell calls of the first step, in order
        self._step_inputs: tuple = ()
        self._calls_this_step: Dict[str, int] = {}
        self._early: Dict[str, Tuple[Tuple[int, ...], object]] = {}
        super().__init__(network, placement, runtime, table, on_call)

    def begin_step(self, inputs: tuple) -> None:
        """Run this group's Cells that read only the model's inputs now (members only)."""
        self._step_inputs = tuple(inputs)
        self._early.clear()
        self._calls_this_step: Dict[str, int] = {}
        if not self.member:
            return
        for name in self._order:  # the leading calls reading only model inputs (sends keep program order)
            positions = self._raw_positions.get(name)
            if positions is None or any(p >= len(inputs) for p in positions):
                break
            args = tuple(inputs[p] for p in positions)
            self._early[name] = (tuple(id(a) for a in args), self._run_member(name, args))

    def end_step(self) -> None:
        """Wait until this process's cross-group sends of the step left (a failed one raises)."""
        outbox().flush()

    def build(self, placement: GroupPlacement) -> None:
        models = _member_models(self.slices(placement), placement) if self.member else {}
        self.placement, self.models = placement, models
        self._remote = {name: RemoteGroupOutput(self.leader, f"group {placement.name!r} output of {name!r} "
                                                             f"(leader rank {self.leader})")
                        for name in self.cells}

    def _entry(self, name: str, cell):
        plain = type(cell).construct
        what = f"group {self.placement.name!r} input gradient of {name!r}"

        def construct(*args):
            if self._inside.get(name):
                return plain(cell, *args)
            self._check_batch(name, args)
            self._learn(name, args)
            if not self.member:
                wrapped = [RecvInputGradient(self.leader, f"{what} (leader rank {self.leader})")(a)
                           if _carries_gradient(a) else a for a in args]
                clock = time.time()
                out = self._remote[name](*wrapped, *cell.trainable_params())
                self.events.append(("receive", name, clock, time.time()))
                return out
            early = self._early.pop(name, None)
            if early is not None and early[0] == tuple(id(a) for a in args):
                return early[1]
            return self._run_member(name, args)

        return construct

    def _run_member(self, name: str, args: tuple):
        """Run Cell `name` on the group's mesh; the leader sends the output to the other processes."""
        leader = world().rank == self.leader
        what = f"group {self.placement.name!r} input gradient of {name!r}"
        wrapped = [SendInputGradient(self.outside, what)(a) if leader and _carries_gradient(a) else a for a in args]
        self._inside[name] = True
        start, clock = time.perf_counter(), time.time()
        try:
            out = self.models[name](*wrapped)
        finally:
            self._inside[name] = False
        seconds = time.perf_counter() - start
        self.events.append(("forward", name, clock, clock + seconds))
        if leader:
            send_output(out, self.outside, f"group {self.placement.name!r} output of {name!r}")
        if self.on_call is not None:
            self.on_call(self, name, args, out, seconds)
        return out

    def _learn(self, name: str, args: tuple) -> None:
        """Remember where a Cell's inputs sit among the model's inputs (None when any input is
        computed, or the Cell runs more than once per step)."""
        count = self._calls_this_step.get(name, 0) + 1
        self._calls_this_step[name] = count
        if name not in self._order:
            self._order.append(name)
        ids = [id(x) for x in self._step_inputs]
        positions = tuple(ids.index(id(a)) if id(a) in ids else -1 for a in args)
        if count > 1 or -1 in positions or not args:
            self._raw_positions[name] = None
        elif name not in self._raw_positions:
            self._raw_positions[name] = positions


class MemberGroupRunner(GroupRunner):
    """A group's Cells in one msrun process, run only by the group's members (each holding its
    rank of the group's mesh); the caller moves tensors between groups itself (the RLHF trainer
    sends each phase's results). A call from a process outside the group is an error.

    Attributes:
        member: whether this process belongs to the group.
    """

    def __init__(self, network, placement: GroupPlacement, runtime, table, on_call=None):
        self.member = world().rank in placement.ranks
        super().__init__(network, placement, runtime, table, on_call)

    def build(self, placement: GroupPlacement) -> None:
        models = _member_models(self.slices(placement), placement) if self.member else {}
        self.placement, self.models = placement, models

    @contextlib.contextmanager
    def bare(self, name: str) -> Iterator[None]:
        """Within the block, Cell `name` runs as the plain Cell in this process (whole inputs, no
        group mesh), member or not: for a frozen role's rows computed by another group."""
        self._inside[name] = True
        try:
            yield
        finally:
            self._inside[name] = False

    def _entry(self, name: str, cell):
        plain = type(cell).construct

        def construct(*args):
            if self._inside.get(name):
                return plain(cell, *args)
            if not self.member:
                raise RuntimeError(f"Cell {name!r} runs on group {self.placement.name!r} (ranks "
                                   f"{list(self.placement.ranks)}); this process (rank {world().rank}) is not a "
                                   "member and cannot run it")
            self._check_batch(name, args)
            self._inside[name] = True
            try:
                return self.models[name](*args)
            finally:
                self._inside[name] = False

        return construct


def _member_models(slices, placement: GroupPlacement) -> dict:
    """Cell name -> DistributedModel of the Cell on the group's mesh (its slice of the job's
    table, `GroupRunner.slices`), in a member process."""
    runtime = DistributedRuntime(world().sub(placement.ranks))  # parameters from the group leader's values
    return {name: runtime.wrap(cell, table, return_dtensor=False) for name, cell, table in slices}


def _carries_gradient(x) -> bool:
    """A floating-point Tensor input (integer inputs such as token ids have no gradient)."""
    import mindspore as ms

    return isinstance(x, Tensor) and not isinstance(x, Parameter) and x.dtype in (ms.float16, ms.float32, ms.float64,
                                                                                  ms.bfloat16)


def check_group_process(config) -> None:
    """Check that this msrun process can run its device group of `config` (a ParallelConfig).

    Raises:
        ValueError: a mesh size other than the job's process count, this process's group
            declaring other `hardware` than its device target, a transport other than shm, or
            ZeRO-1 (`optimizer.sharding`) inside the groups.
    """
    w = world()
    if config.mesh.size != w.size:
        raise ValueError(f"the config's groups span {config.mesh.size} devices but the job has {w.size} processes; "
                         f"launch with msrun --worker_num={config.mesh.size} --local_worker_num={config.mesh.size}")
    target = {"ASCEND": "NPU"}.get(str(ms.get_context("device_target")).upper(),
                                   str(ms.get_context("device_target")).upper())
    mine = next(g for g in config.groups if w.rank in g.ranks)
    if mine.hardware != target:
        raise ValueError(f"{mine.path}.hardware: {mine.hardware}, but this process (rank {w.rank}) runs on {target} "
                         f"(mindspore device_target); set hardware: {target} for the group")
    if w.transport != "shm":
        raise ValueError(f"dist_transport={w.transport!r}: MPMD groups under msrun send tensors between groups over "
                         "the shared-memory transport; set dist_transport='shm' (one host)")
    if config.optimizer_sharding is not None:
        raise ValueError("parallel_config.optimizer.sharding: ZeRO-1 inside MPMD groups runs in simulation mode only; "
                         "under msrun set sharding: False")


def parallelize_groups(model, table, runtime, group_strategies=None):
    """The MPMDModel of `model` in this msrun process (see `parallelize_mpmd`).

    Raises:
        ValueError: a mesh size other than the job's process count, this
            process's group declaring other `hardware` than its device target, a transport
            other than shm, ZeRO-1, or `scheduler: dynamic` (device moves between processes are
            not done under msrun).
    """
    from mindspore_hyper.mpmd import MPMDModel

    dynamic = [g for g in table.groups if g.scheduler == "dynamic"]
    if dynamic:
        raise ValueError(f"{dynamic[0].path}.scheduler: dynamic moves devices between groups, which runs in simulation "
                         "mode only: under msrun a device move would change a process's group (its parameters and "
                         "optimizer states migrated, communicators rebuilt), and the groups run different Cells, so "
                         "no rows of work can move instead; under msrun use scheduler: static")
    check_group_process(table.config)
    return MPMDModel(model, table, runtime, group_strategies, runner_class=DistributedGroupRunner)
