"""Which cores a distributed-mode process runs on (flag `cpu_binding`).

Unbound, a process's MindSpore kernel threads spin and yield on every core while they wait for
work, and the scheduler moves the job's processes between cores: on 2 cores, a 4-process job
spent about a quarter of its CPU time in the kernel (sched_yield, context switches).
Bound, each process computes on its own cores:

- `local` processes on a host with `C` cores they may use: with `local <= C` process i gets the
  contiguous block `cores[i*C//local : (i+1)*C//local]`; with more processes than cores,
  process i gets core `cores[i % C]` (round robin: neighbouring ranks, which are the members of
  the innermost mesh axis and so of its blocking collectives, sit on different cores and compute
  at the same time).
- A process whose affinity is already narrower than the machine (msrun `--bind_core`, taskset,
  numactl, a cpuset) is left as it is: whoever bound it knew more.

Every thread the process has started so far is moved too (MindSpore starts its kernel threads
at its first op); threads started later inherit the binding.
"""
from __future__ import annotations

import os
from typing import FrozenSet, Optional, Sequence

__all__ = ["cores_for", "bind_to_cores"]


def cores_for(local_index: int, local_count: int, cores: Sequence[int]) -> FrozenSet[int]:
    """The cores of process `local_index` of `local_count` processes sharing `cores` (see module).

    Raises:
        ValueError: `local_index` outside [0, local_count), or no cores.
    """
    if not cores:
        raise ValueError("cpu_binding: the process may run on no core (empty affinity)")
    if not 0 <= local_index < local_count:
        raise ValueError(f"cpu_binding: local_index={local_index} is outside the host's {local_count} processes")
    ordered = sorted(cores)
    if local_count > len(ordered):
        return frozenset({ordered[local_index % len(ordered)]})
    n = len(ordered)
    return frozenset(ordered[local_index * n // local_count:(local_index + 1) * n // local_count])


def bind_to_cores(local_index: int, local_count: int) -> Optional[FrozenSet[int]]:
    """Bind this process (every thread it has) to its cores among those it may use.

    Args:
        local_index: this process's index among the job's processes on this host.
        local_count: the job's processes on this host.

    Returns:
        The cores bound to, or None where nothing was changed: a job of one process on this host,
        a process already bound narrower than the machine, or a platform without affinity calls.
    """
    if local_count <= 1 or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    if len(allowed) < (os.cpu_count() or len(allowed)):
        return None
    chosen = cores_for(local_index, local_count, sorted(allowed))
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), chosen)
        except ProcessLookupError:  # a thread that ended after the listing
            continue
    return chosen
