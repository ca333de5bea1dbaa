"""A PPO phase in one msrun process: this process's roles run, the other groups' results arrive.

Every process belongs to one device group and runs the units of the roles placed on it, in the
phase's order (colocated roles time-share the group). The group's leader (its first rank) sends
each result point-to-point to every process outside the group (`cross_group.send_arrays`, queued
to the process's sender thread); then the process receives the results of the other groups'
units from their leaders. So disjoint groups compute a phase at the same time, and every process
ends the phase holding every result (the numbers between phases run in every process). Each run
and each wait is recorded with its wall-clock start and end: the measured timeline.

With `row_blocks` set (the msrun dynamic scheduler's microbatch shares), a unit that can be
computed by rows (a frozen role's, `Unit.rows`) is split: each block of rows is computed by its
group's leader on the plain Cell (every process holds the frozen roles) and sent to every other
process; the blocks are put back together in row order.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mindspore_hyper.rlhf.ppo import Unit
from mindspore_hyper.mpmd.cross_group import outbox, recv_arrays, send_arrays

__all__ = ["PhaseEvent", "ProcessPhases"]


@dataclass(frozen=True)
class PhaseEvent:
    """One measured interval of this process in step `step` (from 0): `kind` "run" (its group
    computed the unit) or "receive" (it waited for another group's result); `start` and `end`
    in seconds since the epoch (time.time, one clock for the host's processes)."""

    step: int
    rank: int
    phase: str
    role: str
    label: str
    kind: str
    start: float
    end: float


class ProcessPhases:
    """Runs PPO phases in this process (see module docstring); a `RunPhase` for `ppo_step`.

    Args:
        rank: this process's global rank.
        size: the job's process count.
        role_ranks: role -> the global ranks of its group (first = leader).
        bare: role -> a context in which the role's Cell runs as the plain Cell in this process
            (needed with `row_blocks`).

    Attributes:
        row_blocks: None, or (group ranks, rows) per block: how units with `rows` are split.
        seconds: phase -> this process's seconds running units in the current step.
    """

    def __init__(self, rank: int, size: int, role_ranks: Mapping[str, Tuple[int, ...]],
                 bare: Optional[Callable[[str], ContextManager]] = None):
        self.rank, self.size = rank, size
        self.role_ranks = {role: tuple(ranks) for role, ranks in role_ranks.items()}
        self.bare = bare
        self.row_blocks: Optional[List[Tuple[Tuple[int, ...], slice]]] = None
        self.events: List[PhaseEvent] = []
        self.seconds: Dict[str, float] = {}
        self.step = 0

    def __call__(self, phase: str, units: Sequence[Unit]) -> List[np.ndarray]:
        results: List[Optional[np.ndarray]] = [None] * len(units)
        split = [u.rows is not None and self.row_blocks is not None for u in units]
        for i, unit in enumerate(units):
            if split[i]:
                results[i] = self._run_blocks(unit)
                continue
            ranks = self._ranks(unit)
            if self.rank not in ranks:
                continue
            start = time.time()
            out = unit.work()
            self._record(unit, "run", start)
            if not isinstance(out, np.ndarray):
                raise TypeError(f"{unit.phase} unit {unit.label!r} of role {unit.role!r} returned "
                                f"{type(out).__name__}; a unit crossing processes must return a numpy array")
            if self.rank == ranks[0]:
                for peer in range(self.size):
                    if peer not in ranks:
                        send_arrays([out], peer, self._what(unit, ranks))
            results[i] = out
        for i, unit in enumerate(units):
            if split[i]:
                results[i] = np.concatenate([self._receive(unit, ranks, rows) if block is None else block
                                             for (ranks, rows), block in zip(self.row_blocks, results[i])])
            elif results[i] is None:
                results[i] = self._receive(unit, self._ranks(unit))
        return results

    def _run_blocks(self, unit: Unit) -> List[Optional[np.ndarray]]:
        """This process's blocks of a split unit (None for the others'); a leader sends its block."""
        blocks: List[Optional[np.ndarray]] = []
        for ranks, rows in self.row_blocks:
            if self.rank != ranks[0]:
                blocks.append(None)
                continue
            start = time.time()
            with self.bare(unit.role):
                out = unit.rows(rows)
            self._record(unit, "run", start, f" rows {rows.start}-{rows.stop - 1}")
            for peer in range(self.size):
                if peer != self.rank:
                    send_arrays([out], peer, self._what(unit, ranks, rows))
            blocks.append(out)
        return blocks

    def _receive(self, unit: Unit, ranks: Tuple[int, ...], rows: Optional[slice] = None) -> np.ndarray:
        start = time.time()
        (out,) = recv_arrays(ranks[0], self._what(unit, ranks, rows))
        self._record(unit, "receive", start, "" if rows is None else f" rows {rows.start}-{rows.stop - 1}")
        return out

    def end_step(self) -> None:
        """Wait until this process's sends of the step left (a failed send raises); count the step."""
        outbox().flush()
        self.step += 1
        self.seconds = {}

    def gather(self) -> List[PhaseEvent]:
        """Every process's events, on every process (a collective: every process calls it)."""
        from mindspore_hyper.runtime.distributed.world import world

        names = sorted({(e.phase, e.role, e.label) for e in self.events})
        kinds = ("run", "receive")
        rows = np.array([[e.step, e.rank, names.index((e.phase, e.role, e.label)), kinds.index(e.kind), e.start, e.end]
                         for e in self.events], np.float64).reshape(-1, 6)
        everyone = world().communicator(tuple(range(self.size))).all_gather(rows, dim=0)
        return [PhaseEvent(int(r[0]), int(r[1]), *names[int(r[2])], kinds[int(r[3])], float(r[4]), float(r[5]))
                for r in everyone]

    def _ranks(self, unit: Unit) -> Tuple[int, ...]:
        if unit.role not in self.role_ranks:
            raise ValueError(f"{unit.phase} unit {unit.label!r}: role {unit.role!r} is in no device group; roles: "
                             f"{sorted(self.role_ranks)}")
        return self.role_ranks[unit.role]

    def _what(self, unit: Unit, ranks: Tuple[int, ...], rows: Optional[slice] = None) -> str:
        part = "" if rows is None else f" rows {rows.start}-{rows.stop - 1}"
        return f"{unit.phase} result {unit.label!r}{part} of role {unit.role!r} (leader rank {ranks[0]})"

    def _record(self, unit: Unit, kind: str, start: float, part: str = "") -> None:
        end = time.time()
        if kind == "run":
            self.seconds[unit.phase] = self.seconds.get(unit.phase, 0.0) + end - start
        self.events.append(PhaseEvent(self.step, self.rank, unit.phase, unit.role, unit.label + part, kind, start, end))
