"""How a measured profile's processes share the host's cores, and how fast a process runs when fewer compute.

A `cpu` profile's kernels are timed with the job's processes computing at once (`calibrate_cpu`):
4 single-threaded processes on 2 cores each got half a core. In a pipeline the ranks do not all
compute at once: during the warm-up and the cool-down, and while a rank waits in a receive, the
others get a larger share of the cores. Assuming the OS shares the cores evenly among the
threads that compute (processor sharing), a process computing while n processes compute gets

    share(n) = min(1, cores / (n x threads))

of a core per thread, and runs `speed(n) = share(n) / share(processes)` times as fast as when
its kernels were measured (1 when n = processes; 2 for one of 4 processes on 2 cores). The
step-time model gives these speeds to the schedule simulation (`schedule.simulate_shared`).

Bound processes (`bound`: the calibration ran them on cores as distributed mode binds its ranks,
flag `cpu_binding`) do not share all the cores: with more processes than cores, process r runs on
core r % cores only (`runtime/distributed/cpu_binding.py`), so it runs `on_core / computing_on_core`
times as fast as measured, where `on_core` processes share its core and `computing_on_core` of
them compute; with as many cores as processes or more, each has cores of its own (speed 1). A
pipeline stage of several processes (data x tensor x context) runs at its slowest process's
speed (`StageSpeeds`). Dedicated accelerators have no such profile (every device computes on
its own).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet

__all__ = ["CoreSharing", "StageSpeeds"]


@dataclass(frozen=True)
class CoreSharing:
    """The cores a profile's processes share and the concurrency its kernels were measured at.

    Attributes:
        cores: cores the job's processes run on.
        processes: processes that computed at once while the kernels were timed (the job's).
        threads: compute threads per process (the job's, as calibrated).
        bound: the processes were bound to cores (one core each, round robin, when they
            outnumber the cores; see module doc) instead of sharing all of them.

    Raises:
        ValueError: a field that is not an int >= 1 (named).
    """

    cores: int
    processes: int
    threads: int
    bound: bool = False

    def __post_init__(self):
        for name in ("cores", "processes", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"core_sharing.{name}={value!r}: expected an int >= 1")
        if not isinstance(self.bound, bool):
            raise ValueError(f"core_sharing.bound={self.bound!r}: expected a bool")

    def share(self, computing: int) -> float:
        """Cores per thread while `computing` processes compute at once: min(1, cores / (computing x threads))."""
        if isinstance(computing, bool) or not isinstance(computing, int) or computing < 1:
            raise ValueError(f"computing={computing!r}: expected an int >= 1")
        return min(1.0, self.cores / (computing * self.threads))

    def speed(self, computing: int) -> float:
        """How many times faster a process runs while `computing` processes compute than when its
        kernels were measured (all `processes` computing): share(computing) / share(processes)."""
        return self.share(computing) / self.share(self.processes)

    def stage_speeds(self, stages: int, per_stage: int) -> "StageSpeeds":
        """The speed of each of `stages` pipeline ranks of `per_stage` processes each (stage s
        holds processes s*per_stage ..), as a function of the computing stages."""
        if self.bound and stages * per_stage != self.processes:
            raise ValueError(f"core_sharing: {stages} stages x {per_stage} processes each = {stages * per_stage} "
                             f"processes, but the profile was measured with processes={self.processes}")
        return StageSpeeds(self, stages, per_stage)


@dataclass(frozen=True)
class StageSpeeds:
    """`speeds(stage, computing stages)` for `schedule.simulate_shared`: how many times faster
    than measured the stage's slowest process runs (hashable: the step-time model caches the
    simulations by it)."""

    sharing: CoreSharing
    stages: int
    per_stage: int

    def __call__(self, stage: int, computing: FrozenSet[int]) -> float:
        sharing, m = self.sharing, self.per_stage
        if not sharing.bound:
            return sharing.speed(len(computing) * m)
        if sharing.processes <= sharing.cores:
            return 1.0  # a block of cores each: nothing shared
        busy = [r for s in computing for r in range(s * m, (s + 1) * m)]
        speeds = []
        for r in range(stage * m, (stage + 1) * m):
            core = r % sharing.cores
            on_core = len(range(core, sharing.processes, sharing.cores))
            speeds.append(on_core / sum(1 for b in busy if b % sharing.cores == core))
        return min(speeds)
