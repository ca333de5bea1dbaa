"""Where one distributed training step's time goes on one rank (`bench_distributed.py --profile`).

Method (timers, no sampling): kernels are launched blocking (`mindspore.runtime.launch_blocking`),
so a kernel's time lands in the call that launched it and `asnumpy` is a pure copy. Wall-clock
timers (seconds, `time.perf_counter`) are wrapped around:

- the step's phases: forward (`DistributedModel.construct`), backward (from the forward's end
  to the start of `_finish_gradients`), gradient sync (`_finish_gradients`: waits on the queued
  data-parallel sums, numpy adds, Tensor constructions), optimizer (to the start of
  `after_update`), the rest (loss `asnumpy`);
- inside them: the forward's local kernels (`OpCall.run`), the transport's C++ calls (the
  `ShmCommunicator`'s `_g`; the aggregator's submit and wait), the numpy side of the
  communicator methods around them, `Tensor.asnumpy`, Tensor constructions from numpy at the
  collective boundary (`process_collectives._tensor`, `model.Tensor`) and `Tensor.shape` reads.

The transport's time is split into copy and wait by a replay: after the timed steps every rank
replays the last step's direct transport calls (same shapes, dtypes and order), each right
after a barrier of its group, so nobody waits for a late peer; the replay's per-call minimum
over `REPLAYS` rounds is the call's copy (and synchronisation) cost, the rest of the step's
transport time is waiting for peers. The aggregator's asynchronous sums are not replayed (their
wait is what the gradient sync shows).

Python dispatch = a phase's wall time minus everything measured inside it. In the backward the
kernels run inside MindSpore's C++ autograd, so its row is "kernels + autograd".
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Dict, List

import numpy as np

REPLAYS = 3
PHASES = ("forward", "backward", "grad sync", "optimizer", "after update", "rest")


class Profile:
    """Accumulates (phase, what) -> seconds for the steps between `step_begin` / `step_end`."""

    def __init__(self):
        self.phase = "rest"
        self.totals: Dict[tuple, float] = defaultdict(float)
        self.counts: Dict[tuple, int] = defaultdict(int)
        self.phase_wall: Dict[str, float] = defaultdict(float)
        self.log: List[tuple] = []  # (communicator proxy, method, args spec, phase, seconds) of one step
        self.steps = 0
        self.active = False
        self._mark = None
        self._depth = 0  # nesting of timed regions: only the outermost counts

    def enter(self, phase: str) -> None:
        now = time.perf_counter()
        if self.active and self._mark is not None:
            self.phase_wall[self.phase] += now - self._mark
        self.phase, self._mark = phase, now

    def step_begin(self) -> None:
        self.active, self.log = True, []
        self.enter("rest")

    def step_end(self) -> None:
        self.enter("rest")
        self.active, self._mark = False, None
        self.steps += 1

    def add(self, what: str, seconds: float) -> None:
        if self.active:
            self.totals[(self.phase, what)] += seconds
            self.counts[(self.phase, what)] += 1

    def timed(self, what: str, fn):
        """`fn` wrapped: its wall time adds to `what` unless inside another timed region."""
        prof = self

        def wrapper(*args, **kwargs):
            if prof._depth:
                return fn(*args, **kwargs)
            prof._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                prof._depth -= 1
                prof.add(what, time.perf_counter() - start)
        wrapper.__wrapped__ = fn
        return wrapper


PROFILE = Profile()
_REPLAYED = {"all_reduce", "all_gather", "all_gather_v", "reduce_scatter", "all_to_all_v", "broadcast"}
_WRAPPED_RESULT = {"make_aggregator", "submit", "submit_many"}


def _spec(value):
    if isinstance(value, np.ndarray):
        return ("array", value.shape, value.dtype)
    return ("value", value)


def _rebuild(spec):
    return np.zeros(spec[1], spec[2]) if spec[0] == "array" else spec[1]


class _Timed:
    """Proxy of a C++ transport object: every method call's time counts as "transport"; the
    direct collectives are logged for the replay; aggregators and their handles are proxied too."""

    def __init__(self, target, kind="transport"):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_kind", kind)

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if not callable(value):
            return value
        proxy = self

        def call(*args, **kwargs):
            start = time.perf_counter()
            result = value(*args, **kwargs)
            seconds = time.perf_counter() - start
            if PROFILE.active:
                PROFILE.add(f"{proxy._kind}", seconds)
                if name in _REPLAYED and proxy._kind == "transport":
                    PROFILE.log.append((proxy, name, [_spec(a) for a in args], PROFILE.phase, seconds))
            if name in _WRAPPED_RESULT:
                return _Timed(result, "aggregator" if name == "make_aggregator" else "aggregator wait")
            return result
        return call

    def __setattr__(self, name, value):
        setattr(self._target, name, value)


def install() -> None:
    """Blocking kernel launches and the timers of the module docstring (call before the model is built)."""
    import mindspore as ms
    from mindspore import Tensor

    from mindspore_hyper.comm import process_collectives, shm
    from mindspore_hyper.dtensor import dispatch
    from mindspore_hyper.runtime.distributed import distributed_model as dmodel

    ms.runtime.launch_blocking()
    prof = PROFILE

    Tensor.asnumpy = prof.timed("asnumpy", Tensor.asnumpy)
    shape = Tensor.shape
    Tensor.shape = property(prof.timed("Tensor.shape", shape.fget))
    process_collectives._tensor = prof.timed("to Tensor", process_collectives._tensor)
    for module in (process_collectives, dmodel):
        if hasattr(module, "adopt"):  # the zero-copy constructions (process_collectives.adopt)
            module.adopt = prof.timed("to Tensor", module.adopt)
    tensor_class = dmodel.Tensor
    dmodel.Tensor = prof.timed("to Tensor", tensor_class)
    dispatch.OpCall.run = prof.timed("kernels", dispatch.OpCall.run)

    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast",
                 "send", "recv", "barrier"):
        setattr(shm.ShmCommunicator, name, _numpy_side(getattr(shm.ShmCommunicator, name)))
    init = shm.ShmCommunicator.__init__

    def timed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._g = _Timed(self._g)
    shm.ShmCommunicator.__init__ = timed_init

    construct = dmodel.DistributedModel.construct

    def forward(self, *inputs):
        prof.enter("forward")
        try:
            return construct(self, *inputs)
        finally:
            prof.enter("backward")
    dmodel.DistributedModel.construct = forward

    finish = dmodel.DistributedModel._finish_gradients

    def sync(self, *args):
        prof.enter("grad sync")
        try:
            return finish(self, *args)
        finally:
            prof.enter("optimizer")
    dmodel.DistributedModel._finish_gradients = sync

    after = dmodel.DistributedModel.after_update

    def after_update(self):
        prof.enter("after update")
        try:
            return after(self)
        finally:
            prof.enter("rest")
    dmodel.DistributedModel.after_update = after_update


def _numpy_side(fn):
    """A communicator method: its time minus the transport's inside is "comm numpy"."""
    def wrapper(self, *args, **kwargs):
        before = sum(v for (p, w), v in PROFILE.totals.items() if w.startswith(("transport", "aggregator")))
        start = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            seconds = time.perf_counter() - start
            after = sum(v for (p, w), v in PROFILE.totals.items() if w.startswith(("transport", "aggregator")))
            PROFILE.add("comm numpy", seconds - (after - before))
    return wrapper


def replay() -> Dict[str, float]:
    """Copy cost per phase of the last step's direct transport calls (see module docstring);
    collective: every rank must call it after the same steps."""
    best = [float("inf")] * len(PROFILE.log)
    for _ in range(REPLAYS):
        for i, (proxy, name, specs, phase, _) in enumerate(PROFILE.log):
            target = proxy._target
            args = [_rebuild(s) for s in specs]
            target.barrier()
            start = time.perf_counter()
            getattr(target, name)(*args)
            best[i] = min(best[i], time.perf_counter() - start)
    copy = defaultdict(float)
    for (_, _, _, phase, _), seconds in zip(PROFILE.log, best):
        copy[phase] += seconds
    return dict(copy)


def table(step_median: float) -> dict:
    """Per-step seconds by phase and component (a JSON-able dict; see `format_table`)."""
    n = max(PROFILE.steps, 1)
    copy = replay()
    rows = {}
    for phase in PHASES:
        parts = {w: v / n for (p, w), v in PROFILE.totals.items() if p == phase}
        counts = {w: c / n for (p, w), c in PROFILE.counts.items() if p == phase}
        wall = PROFILE.phase_wall.get(phase, 0.0) / n
        transport = parts.pop("transport", 0.0)
        phase_copy = min(copy.get(phase, 0.0), transport)
        parts["transport copy"] = phase_copy
        parts["transport wait"] = transport - phase_copy
        parts["python dispatch / other"] = wall - sum(parts.values())
        rows[phase] = {"wall": wall, "parts": parts, "calls": counts}
    return {"step_median_profiled": step_median, "steps": n, "phases": rows}


def format_table(result: dict) -> str:
    lines = [f"rank 0, blocking launches, {result['steps']} steps, median step {result['step_median_profiled']:.3f} s",
             f"{'phase':<13} {'component':<26} {'s/step':>8} {'calls/step':>10}"]
    for phase, row in result["phases"].items():
        if row["wall"] <= 0:
            continue
        lines.append(f"{phase:<13} {'(wall)':<26} {row['wall']:8.3f}")
        for what, seconds in sorted(row["parts"].items(), key=lambda kv: -kv[1]):
            calls = row["calls"].get(what)
            lines.append(f"{'':<13} {what:<26} {seconds:8.3f} {'' if calls is None else f'{calls:10.0f}'}")
    return "\n".join(lines)


# ---------------------------------------------------------------- torch's peer
def torch_collective_seconds(prof) -> Dict[str, float]:
    """Seconds in collectives per phase of one `torch.profiler` step: the outermost c10d events
    (DTensor's functional collectives with their `wait_tensor`, and the explicit all-reduces)
    under each `phase:<name>` record_function range."""
    totals = defaultdict(float)
    for event in prof.events():
        if "c10d" not in event.name and "wait_tensor" not in event.name:
            continue
        phase, parent, nested = None, event.cpu_parent, False
        while parent is not None:
            if "c10d" in parent.name or "wait_tensor" in parent.name:
                nested = True
            if parent.name.startswith("phase:"):
                phase = parent.name[len("phase:"):]
            parent = parent.cpu_parent
        if not nested and phase is not None:
            totals[phase] += event.cpu_time_total / 1e6
    return dict(totals)
