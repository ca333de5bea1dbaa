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
Dedicated accelerators have no such profile (every device computes on its own).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CoreSharing"]


@dataclass(frozen=True)
class CoreSharing:
    """The cores a profile's processes share and the concurrency its kernels were measured at.

    Attributes:
        cores: cores the job's processes run on.
        processes: processes that computed at once while the kernels were timed (the job's).
        threads: compute threads per process (the job's, as calibrated).

    Raises:
        ValueError: a field that is not an int >= 1 (named).
    """

    cores: int
    processes: int
    threads: int

    def __post_init__(self):
        for name in ("cores", "processes", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"core_sharing.{name}={value!r}: expected an int >= 1")

    def share(self, computing: int) -> float:
        """Cores per thread while `computing` processes compute at once: min(1, cores / (computing x threads))."""
        if isinstance(computing, bool) or not isinstance(computing, int) or computing < 1:
            raise ValueError(f"computing={computing!r}: expected an int >= 1")
        return min(1.0, self.cores / (computing * self.threads))

    def speed(self, computing: int) -> float:
        """How many times faster a process runs while `computing` processes compute than when its
        kernels were measured (all `processes` computing): share(computing) / share(processes)."""
        return self.share(computing) / self.share(self.processes)
