"""The run behind HyperParallel-API DTensors: one Execution per mesh, from the context's mode.

`mode="simulation"` holds every rank of the mesh in this process; `mode="distributed"` (msrun)
holds this process's rank. DTensors made by the API (from_local, distribute_tensor, factories,
parallelized modules) of one mesh share its Execution, so their memory and communication are
counted together (`session_accounting`) and reported by `mindspore-hyper run`. A mesh on some
of the job's ranks runs on those (under msrun: a sub-world of their processes); in a per-rank
simulation (rank_threads.py) each thread simulates the whole mesh of its rank.
"""
from __future__ import annotations

import inspect
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

from mindspore_hyper.context import get_context
from mindspore_hyper.dtensor.accounting import Accounting
from mindspore_hyper.hyper_parallel.rank_threads import thread_rank
from mindspore_hyper.hyper_parallel.step_phases import reset_steps, track
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.softmax_backward_cache import ensure_softmax_backward

__all__ = ["execution_for", "calling_rank", "runtime_of", "job_ranks_of", "session_executions", "reset_session",
           "RankDependentError", "refuse_in_simulation", "script_line",
           "holds_all_ranks", "job_size", "current_meshes", "mesh_of", "remember_mesh",
           "prepare_elsewhere", "is_prepared_elsewhere", "named_groups", "refuse_mindspore_dry_run"]


def refuse_mindspore_dry_run() -> None:
    """Refuse MindSpore's own dry run (`MS_SIMULATION_LEVEL` set, as upstream's dry-run tests set
    it): MindSpore then launches no kernels, so every value this package computes would be garbage.

    Raises:
        RuntimeError: `MS_SIMULATION_LEVEL` is set to anything but "" or "0".
    """
    level = os.environ.get("MS_SIMULATION_LEVEL", "")
    if level not in ("", "0"):
        raise RuntimeError(f"{script_line()}: MS_SIMULATION_LEVEL={level} is MindSpore's own dry run, which launches "
                           "no kernels, so no value would be computed; this package simulates the devices with "
                           "values itself (mindspore-hyper run --devices N) and dry-runs with shapes only "
                           "(mindspore-hyper dryrun): unset MS_SIMULATION_LEVEL")


_EXECUTIONS: Dict[tuple, object] = {}  # (root, members, mode, per-rank thread's rank) -> Execution


def _runtime():
    from mindspore_hyper.parallelize import RUNTIMES

    mode = get_context("mode")
    runtime = RUNTIMES[mode]()
    if not runtime.runs_op_by_op():
        raise ValueError(f"the HyperParallel API runs op by op (mode='simulation' or 'distributed'); mode={mode!r} "
                         "translates to MindSpore's static-graph parallel: on Ascend run the same script with "
                         "upstream's hyper_parallel package")
    return runtime


def holds_all_ranks() -> bool:
    """Whether this process holds every rank of the job (the simulation)."""
    return _runtime().holds_all_ranks()


def job_size() -> int:
    """The job's device count (simulated devices, or msrun processes)."""
    return _runtime().device_count()


def execution_for(root: Layout, members: Optional[Tuple[int, ...]] = None):
    """The Execution of `root`'s mesh in the current mode (made on first use).

    Args:
        root: the mesh (its ranks 0..n-1).
        members: the job's rank of each of its ranks (ascending); None: 0..n-1.

    Raises:
        ValueError: a rank outside the job, or (msrun, per-rank simulation) the calling rank is
            not one of `members` (torch gives such a rank DTensors of empty local tensors; not here).
    """
    members = tuple(range(root.size)) if members is None else tuple(members)
    runtime = _runtime()
    count = runtime.device_count()
    outside = [r for r in members if not 0 <= r < count]
    if outside:
        raise ValueError(f"a DeviceMesh of shape {root.device_matrix} on ranks {list(members)}: rank {outside[0]} is "
                         f"outside the job ({runtime.device_count_text(count)}); "
                         f"{runtime.device_count_hint(max(members) + 1)}")
    me = thread_rank()
    if me is not None or not runtime.holds_all_ranks():
        rank = me if me is not None else runtime.processes.rank
        if rank not in members:
            raise ValueError(f"{script_line()}: rank {rank} is not in the DeviceMesh of ranks {list(members)}; a rank "
                             f"outside a mesh holds no part of its DTensors (torch gives it empty local tensors, which "
                             f"this package does not make): guard the code with `if mesh.get_coordinate() is not "
                             f"None`")
    key = (root, members, runtime.name, me)
    if key not in _EXECUTIONS:
        if runtime.computes_values():  # MindSpore's softmax gradients must be right (rank threads take turns)
            refuse_mindspore_dry_run()
            ensure_softmax_backward()
        if me is None and members != tuple(range(count)):
            runtime = runtime.sub_runtime(members)
        execution = runtime.execution(root, Accounting(root.size))
        _RUNTIME_OF[id(execution)] = runtime
        if me is None:  # its training steps' phases, for the step's memory series (not per-rank threads':
            track(execution)  # the phases are marked process-wide)
        if members != tuple(range(root.size)):
            execution.job_ranks = members
        _EXECUTIONS[key] = execution
    return _EXECUTIONS[key]


def calling_rank(what: str) -> int:
    """The job rank asking `what`: the thread's in a per-rank simulation, the process's under msrun.

    Raises:
        RankDependentError: in the plain simulation (every rank runs the script at once).
    """
    me = thread_rank()
    if me is not None:
        return me
    refuse_in_simulation(what)
    return _runtime().processes.rank


_RUNTIME_OF: Dict[int, object] = {}


def job_ranks_of(execution) -> Tuple[int, ...]:
    """The job's rank of each rank of `execution`'s mesh."""
    return execution.job_ranks if execution.job_ranks is not None else tuple(range(execution.mesh.size))


def runtime_of(execution):
    """The Runtime that made `execution` (its `materialize` lays Parameters out)."""
    return _RUNTIME_OF[id(execution)]


def session_executions():
    """Every Execution the API made in this process, in creation order. In a per-rank run every
    rank of a mesh simulates the whole mesh (the same values): the first rank's stands for it."""
    return [execution for (_, members, _, me), execution in _EXECUTIONS.items() if me is None or me == members[0]]


class RankDependentError(RuntimeError):
    """A rank-dependent question asked in simulation, where the script runs once for all ranks."""


def _refuse_in_per_rank_run(what: str) -> None:
    """Raise inside a per-rank simulation (rank_threads.py): `what` (process groups) is not
    simulated there; meshes and their DTensors are (each thread simulates its mesh's devices).

    Raises:
        RankDependentError: in a per-rank run's thread.
    """
    if thread_rank() is not None:
        raise RankDependentError(f"{script_line()}: {what} is not simulated in a per-rank run (mindspore-hyper run "
                                 "--per-rank): use a DeviceMesh's get_group(), or run under msrun (--processes N)")


def refuse_in_simulation(what: str) -> None:
    """Raise when this process holds every rank (the simulation): `what` would differ per device.

    Raises:
        RankDependentError: in simulation, naming `what` and the ways out.
    """
    _refuse_in_per_rank_run(what)
    runtime = _runtime()
    if runtime.holds_all_ranks():
        raise RankDependentError(
            f"{script_line()}: {what} differs per device, and the simulation runs the script once for all "
            f"{runtime.device_count()} virtual devices; build data globally (distribute_tensor, DTensor factories) "
            "instead of per rank, run the script once per rank (mindspore-hyper run --per-rank: scripts without "
            "DTensors, such as pipeline stages), or run the script under msrun (mindspore-hyper run --processes N "
            "gives each process its rank)")


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script_line() -> str:
    """`file:line` of the innermost caller outside this package (the user's script)."""
    for frame in inspect.stack()[1:]:
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR):
            return f"{frame.filename}:{frame.lineno}"
    return "<unknown>"


_CURRENT = threading.local()  # .meshes: the open `with mesh:` blocks' meshes, innermost last, above the last made
_MESH_OF: Dict[int, tuple] = {}  # id(Parameter) -> (the Parameter, the mesh view it is laid out on)


def current_meshes() -> List[Any]:
    """The stack behind `get_current_mesh` (the list itself: callers push and pop); one per thread,
    as upstream's (a per-rank run's threads are ranks of their own)."""
    if not hasattr(_CURRENT, "meshes"):
        _CURRENT.meshes = []
    return _CURRENT.meshes


def remember_mesh(param, mesh) -> None:
    """Record that `param` is laid out on `mesh` (a view)."""
    _MESH_OF[id(param)] = (param, mesh)


def mesh_of(param) -> Optional[Any]:
    """The mesh view `param` was laid out on by the API, or None."""
    entry = _MESH_OF.get(id(param))
    if entry is not None and entry[0] is param:
        return entry[1]
    return getattr(param, "laid_out_view", None)  # a `Parameter(dtensor)` keeps its DTensor's view


_PREPARED: Dict[int, Any] = {}  # id(Parameter) -> the Parameter, for those a Cell's own hook prepares
_GROUP_NAMES: Dict[str, Any] = {}  # a process group's name (create_group, split_group) -> its ProcessGroup


def named_groups() -> Dict[str, Any]:
    """The process groups named by the script (`create_group`, `split_group`), by name (the dict itself)."""
    return _GROUP_NAMES


def prepare_elsewhere(param) -> None:
    """Mark `param` as read through its own Cell's hook (fully_shard's gather), so an enclosing
    Cell's hook does not hand it out as it is."""
    _PREPARED[id(param)] = param


def is_prepared_elsewhere(param) -> bool:
    return _PREPARED.get(id(param)) is param


def reset_session() -> None:
    """Forget the API's meshes, executions and laid-out Parameters (a new script in the same
    process starts afresh)."""
    current_meshes().clear()
    _MESH_OF.clear()
    _PREPARED.clear()
    _GROUP_NAMES.clear()
    _EXECUTIONS.clear()
    _RUNTIME_OF.clear()
    reset_steps()
