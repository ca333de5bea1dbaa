"""The run behind HyperParallel-API DTensors: one Execution per mesh, from the context's mode.

`mode="simulation"` holds every rank of the mesh in this process; `mode="distributed"` (msrun)
holds this process's rank. DTensors made by the API (from_local, distribute_tensor, factories,
parallelized modules) of one mesh share its Execution, so their memory and communication are
counted together (`session_accounting`) and reported by `mindspore-hyper run`.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Dict, List, Optional, Tuple

from mindspore_hyper.context import get_context
from mindspore_hyper.dtensor.accounting import Accounting
from mindspore_hyper.shard.layout import Layout

__all__ = ["execution_for", "runtime_of", "check_device_count", "session_executions", "reset_session",
           "RankDependentError", "refuse_in_simulation", "script_line",
           "holds_all_ranks", "job_size", "current_meshes", "mesh_of", "remember_mesh",
           "prepare_elsewhere", "is_prepared_elsewhere"]

_EXECUTIONS: Dict[Tuple[Layout, str], object] = {}


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


def check_device_count(size: int, what: str) -> None:
    """Raise unless a mesh of `size` devices matches this job (the message says how to match).

    Raises:
        ValueError: the job has another number of devices.
    """
    runtime = _runtime()
    count = runtime.device_count()
    if size != count:
        raise ValueError(f"{what}: {size} devices, but {runtime.device_count_text(count)}; "
                         f"{runtime.device_count_hint(size)}")


def execution_for(root: Layout):
    """The Execution of `root`'s mesh in the current mode (made on first use)."""
    _refuse_in_per_rank_run()
    runtime = _runtime()
    key = (root, runtime.name)
    if key not in _EXECUTIONS:
        check_device_count(root.size, f"a DeviceMesh of shape {root.device_matrix}")
        execution = runtime.execution(root, Accounting(root.size))
        _RUNTIME_OF[id(execution)] = runtime
        _EXECUTIONS[key] = execution
    return _EXECUTIONS[key]


_RUNTIME_OF: Dict[int, object] = {}


def runtime_of(execution):
    """The Runtime that made `execution` (its `materialize` lays Parameters out)."""
    return _RUNTIME_OF[id(execution)]


def session_executions():
    """Every Execution the API made in this process, in creation order."""
    return list(_EXECUTIONS.values())


class RankDependentError(RuntimeError):
    """A rank-dependent question asked in simulation, where the script runs once for all ranks."""


def _refuse_in_per_rank_run() -> None:
    """Raise inside a per-rank simulation (rank_threads.py): meshes and DTensors simulate all
    their devices in one script run, which a script running once per rank is not.

    Raises:
        RankDependentError: in a per-rank run's thread.
    """
    from mindspore_hyper.hyper_parallel.rank_threads import thread_rank

    if thread_rank() is not None:
        raise RankDependentError(f"{script_line()}: a DeviceMesh's DTensors simulate all its devices in one script "
                                 "run, but this script runs once per rank (mindspore-hyper run --per-rank): run it "
                                 "without --per-rank, or under msrun (--processes N)")


def refuse_in_simulation(what: str) -> None:
    """Raise when this process holds every rank (the simulation): `what` would differ per device.

    Raises:
        RankDependentError: in simulation, naming `what` and the ways out.
    """
    _refuse_in_per_rank_run()
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


_CURRENT: List[Any] = []  # the meshes of open `with mesh:` blocks, innermost last, above the last made one
_MESH_OF: Dict[int, tuple] = {}  # id(Parameter) -> (the Parameter, the mesh view it is laid out on)


def current_meshes() -> List[Any]:
    """The stack behind `get_current_mesh` (the list itself: callers push and pop)."""
    return _CURRENT


def remember_mesh(param, mesh) -> None:
    """Record that `param` is laid out on `mesh` (a view)."""
    _MESH_OF[id(param)] = (param, mesh)


def mesh_of(param) -> Optional[Any]:
    """The mesh view `param` was laid out on by the API, or None."""
    entry = _MESH_OF.get(id(param))
    return entry[1] if entry is not None and entry[0] is param else None


_PREPARED: Dict[int, Any] = {}  # id(Parameter) -> the Parameter, for those a Cell's own hook prepares


def prepare_elsewhere(param) -> None:
    """Mark `param` as read through its own Cell's hook (fully_shard's gather), so an enclosing
    Cell's hook does not hand it out as it is."""
    _PREPARED[id(param)] = param


def is_prepared_elsewhere(param) -> bool:
    return _PREPARED.get(id(param)) is param


def reset_session() -> None:
    """Forget the API's meshes, executions and laid-out Parameters (a new script in the same
    process starts afresh)."""
    _CURRENT.clear()
    _MESH_OF.clear()
    _PREPARED.clear()
    _EXECUTIONS.clear()
    _RUNTIME_OF.clear()
