"""StageRunner: executes one rank's action list of a Schedule on its stages.

Forward of stage s on microbatch k reads the model input (stage 0) or the activation of stage
s-1 (received, or handed over locally when s-1 runs on the same rank, the turn of a V), and
produces the activation for s+1 (the last stage produces the loss). A backward reads the
gradient from stage s+1 and produces the one for s-1. Sends take what a compute produced;
receives put what arrived where the compute finds it. Every action's real start and end are
recorded (`events`), the bytes sent per stage boundary (`sent_bytes`), and per compute action the
block sizes of the stage inputs kept for backwards before and after it (`kept_inputs`, the step's
memory series: pipeline_step_memory.py). MindSpore launches
kernels asynchronously, so a compute action ends with `mindspore.runtime.synchronize()`: its
recorded end is when its kernels finished (else the next send's copy to numpy would absorb the
rest of the compute time). MindSpore's first such call on CPU only logs an error and returns
(mindspore_log.CPU_SYNCHRONIZE_ERROR), so `synchronize_kernels` makes it twice, that message silenced.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Callable, Dict, List, Sequence, Tuple

import mindspore as ms
from mindspore import Tensor

from mindspore_hyper.mindspore_log import CPU_SYNCHRONIZE_ERROR, silenced
from mindspore_hyper.schedule.actions import Action, ActionKind, P2PTensor, Payload
from mindspore_hyper.schedule.schedule import Schedule
from mindspore_hyper.pipeline.computation import StageComputation

__all__ = ["StageRunner", "synchronize_kernels"]

_SYNCHRONIZED_ONCE = False


def synchronize_kernels() -> None:
    """Wait until every launched kernel finished (`mindspore.runtime.synchronize()`)."""
    global _SYNCHRONIZED_ONCE
    if not _SYNCHRONIZED_ONCE:
        with silenced(CPU_SYNCHRONIZE_ERROR):
            ms.runtime.synchronize()  # on CPU: logs CPU_SYNCHRONIZE_ERROR once and returns without waiting
        _SYNCHRONIZED_ONCE = True
    ms.runtime.synchronize()


class StageRunner:
    """One rank's executor (see module docstring).

    Args:
        schedule: the validated Schedule.
        rank: the pipeline rank whose list this runner executes.
        stages: virtual stage -> its StageComputation, for the rank's stages.
        transport: `send(src_rank, key, tensor, peer)`, and `poll(rank, key)` (in process) or
            `recv(key, peer)` (blocking, between processes).
        clock: seconds, for the recorded events.
        all_inputs: every stage takes all the model inputs after its activation (a model
            pipelined through its construct); else the last stage takes the loss's targets.
    """

    def __init__(self, schedule: Schedule, rank: int, stages: Dict[int, StageComputation], transport,
                 clock: Callable[[], float] = time.perf_counter, all_inputs: bool = False):
        missing = set(schedule.stages_of(rank)) - set(stages)
        if missing:
            raise ValueError(f"rank {rank}: no computation for its stages {sorted(missing)}")
        self.schedule, self.rank, self.stages, self.transport, self.clock = schedule, rank, stages, transport, clock
        self.all_inputs = all_inputs
        self.actions: Tuple[Action, ...] = schedule.actions[rank]
        self.last_stage = schedule.num_virtual_stages - 1
        self.start_step([])

    def start_step(self, microbatches: Sequence[Tuple]) -> None:
        """Begin a step on `microbatches` (per microbatch: the model input, then the targets)."""
        self.microbatches = list(microbatches)
        self.pc = 0
        self.ready: Dict[P2PTensor, Tensor] = {}  # inputs received or handed over locally
        self.produced: Dict[P2PTensor, Tensor] = {}  # outputs waiting for their send
        self.events: List[Tuple[int, Action, float, float]] = []
        self.sent_bytes: Dict[Tuple[str, int, int], Tuple[int, int]] = {}  # (payload, src, dst) -> (count, bytes)
        self.peak_live_bytes = 0
        self.kept_inputs: List[Tuple[Action, Counter, Counter]] = []  # compute action, kept sizes before, after

    @property
    def done(self) -> bool:
        return self.pc >= len(self.actions)

    def advance(self, blocking: bool) -> int:
        """Run actions in order; without `blocking`, stop at a receive whose tensor has not
        arrived (in process). Returns the number of actions run."""
        ran = 0
        while self.pc < len(self.actions):
            action = self.actions[self.pc]
            start = self.clock()
            if action.kind is ActionKind.RECV:
                if blocking:
                    value = self.transport.recv(action.tensor, action.peer)
                else:
                    value = self.transport.poll(self.rank, action.tensor)
                    if value is None:
                        return ran
                self.ready[action.tensor] = value if isinstance(value, Tensor) else Tensor(value)
            elif action.kind is ActionKind.SEND:
                value = self.produced.pop(action.tensor)
                key = (action.payload.value, action.tensor.src_stage, action.tensor.dst_stage)
                count, nbytes = self.sent_bytes.get(key, (0, 0))
                self.sent_bytes[key] = (count + 1, nbytes + int(value.nbytes))
                self.transport.send(self.rank, action.tensor, value, action.peer)
            else:
                before = self._kept_sizes()
                self._compute(action)
                self.kept_inputs.append((action, before, self._kept_sizes()))
                synchronize_kernels()
            self.events.append((self.rank, action, start, self.clock()))
            self.pc += 1
            ran += 1
        return ran

    def _compute(self, action: Action) -> None:
        s, k = action.stage, action.microbatch
        stage = self.stages[s]
        if action.kind is ActionKind.FORWARD:
            inputs = self.microbatches[k]
            x = inputs[0] if s == 0 else self._take(P2PTensor(Payload.ACTIVATION, s - 1, s, k))
            targets = inputs if self.all_inputs else (inputs[1:] if s == self.last_stage else ())
            out = stage.forward(k, x, targets)
            if s != self.last_stage:
                self._give(P2PTensor(Payload.ACTIVATION, s, s + 1, k), out)
            self.peak_live_bytes = max(self.peak_live_bytes, sum(c.live_input_bytes() for c in self.stages.values()))
        elif action.kind is ActionKind.BACKWARD_WEIGHT:
            stage.backward_weight(k)
        else:
            dy = None if s == self.last_stage else self._take(P2PTensor(Payload.GRADIENT, s + 1, s, k))
            run = stage.backward if action.kind is ActionKind.BACKWARD else stage.backward_input
            dx = run(k, dy)
            if s != 0:
                self._give(P2PTensor(Payload.GRADIENT, s, s - 1, k), dx)

    def _kept_sizes(self) -> Counter:
        """Block size -> count of the stage inputs (and dropout masks) this rank keeps for backwards."""
        sizes: Counter = Counter()
        for c in self.stages.values():
            sizes.update(c.live_input_sizes())
        return sizes

    def _take(self, key: P2PTensor) -> Tensor:
        if key in self.ready:
            return self.ready.pop(key)
        raise RuntimeError(f"rank {self.rank}: '{key}' is needed but was neither received nor produced here "
                           f"(the schedule is invalid)")

    def _give(self, key: P2PTensor, value: Tensor) -> None:
        """An output for the stage that consumes it: local if that stage runs on this rank."""
        if self.schedule.stage_to_rank[key.dst_stage] == self.rank:
            self.ready[key] = value
        else:
            self.produced[key] = value
