"""`auto_parallelize`'s builder of an MPMD program: a strategy with device groups (hyper_mpmd on)
becomes an `MPMDModel` -- every group in this process (a runtime whose job runs in one process:
simulation), or this msrun process's group (distributed, `parallelize_groups`)."""
from __future__ import annotations

from mindspore_hyper.mpmd import MPMDModel, check_mpmd_enabled
from mindspore_hyper.mpmd.distributed import parallelize_groups

__all__ = ["parallelize_mpmd"]


def _simulated_groups(model, table, runtime, group_strategies):
    runtime.check_mesh(table.mesh)
    return MPMDModel(model, table, runtime, group_strategies)


def parallelize_mpmd(model, table, runtime, group_strategies=None, return_dtensor: bool = False):
    """The MPMDModel of `model` over the device groups of `table` (a resolved StrategyTable) in
    `runtime`'s mode. `table` becomes the job's table with every group's rows (resolved once on
    the group's own mesh, each group's runtime running its slice: `MPMDModel.table`).

    Raises:
        ValueError: GRAPH_MODE, hyper_mpmd off, return_dtensor=True, a mode without MPMD groups,
            or what the mode's builder refuses (mesh size, msrun limits; named).
    """
    if not runtime.runs_op_by_op():
        raise ValueError(f"device groups (process_groups / strategy: mpmd entries): mode={runtime.name!r}; they run in "
                         "('simulation', 'distributed') mode")
    runtime.check_op_by_op()
    runtime.check_composition("device groups")
    check_mpmd_enabled(table.groups)
    if return_dtensor:
        raise ValueError("return_dtensor=True: an MPMD model returns global tensors (each group has its own "
                         "mesh); drop return_dtensor")
    build = _simulated_groups if runtime.in_one_process() else parallelize_groups
    return build(model, table, runtime, group_strategies)
