"""A pipeline stage on its own sub-mesh: the mesh without the pipeline axis, the strategy sliced to
the stage's parameters, and the stage wrapped by the runtime of the stage's devices."""
from __future__ import annotations

from typing import Optional

from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.strategy.stage_table import stage_table

__all__ = ["mesh_without_axis", "parallel_stage"]


def mesh_without_axis(mesh: Layout, axis: str) -> Optional[Layout]:
    """The mesh of one stage (the pipeline axis dropped; stage ranks in the order of the global
    ranks sharing a pipeline coordinate), or None when that is a single device."""
    a = mesh.axis_index(axis)
    keep = [i for i in range(mesh.ndim) if i != a]
    if not keep or all(mesh.device_matrix[i] == 1 for i in keep):
        return None
    return Layout(tuple(mesh.device_matrix[i] for i in keep), tuple(mesh.alias_names[i] for i in keep))


def parallel_stage(model, cell):
    """Stage `cell` of PipelineModel `model` on the stage sub-mesh, wrapped by the runtime of the
    stage's devices (`sub_runtime`): a SimulatedModel (simulation) or a DistributedModel over this
    stage's processes (msrun)."""
    # the job's table, resolved once, sliced to this stage's parameters on the stage mesh
    names = [n for n, _ in cell.parameters_and_names()]
    table = stage_table(model.table, names, model.stage_mesh, model.options.axis).check_shapes()
    # under msrun the build broadcast every Parameter from rank 0 already (every process builds
    # the whole model, but only a stage's processes build its stage: no broadcast over the job here)
    # (in one process every stage's devices are virtual ones of this process: any ranks do)
    stage_devices = model.mesh.ranks if model.in_one_process else model.stage_processes
    runtime = model.runtime.sub_runtime(stage_devices, same_initial_values=True)
    return runtime.wrap(cell, table, return_dtensor=False)
