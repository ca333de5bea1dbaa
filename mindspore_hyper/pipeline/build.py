"""`parallelize_pipeline`: from a model and a strategy with pipeline stages to a PipelineModel."""
from __future__ import annotations

import warnings

from mindspore_hyper.pipeline.options import PipelineOptions
from mindspore_hyper.pipeline.stages import (balanced_split, check_split, check_unshared, layers_of,
                                             split_from_table)
from mindspore_hyper.schedule.build import build_schedule
from mindspore_hyper.strategy.resolve import StrategyTable

__all__ = ["parallelize_pipeline"]


def parallelize_pipeline(model, table, runtime, pipeline=None, return_dtensor: bool = False):
    """Wrap `model` to run its pipeline schedule on `runtime` (simulation or distributed).

    Args:
        model: a chain of layers (see pipeline/stages.py).
        table: the resolved StrategyTable of a strategy whose mesh has the pipeline axis.
        runtime: the SimulationRuntime or DistributedRuntime the stages run on.
        pipeline: PipelineOptions, a mapping of its fields, True (defaults), or None (a config's
            `pipeline: N` with the defaults; a model that cannot be cut then warns and returns None).
        return_dtensor: must be False (stages hand global tensors to each other).

    Returns:
        A PipelineModel, or None when a config asks for stages but the model is not a chain of
        layers (a warning says so; the caller then runs it as one SPMD program).

    Raises:
        ValueError: naming the argument: unknown schedule kind, microbatches or stage counts that
            do not fit, a mesh without the pipeline axis, a strategy sharding along it, data or
            tensor axes under msrun for a model pipelined through its construct, `scheduler: dynamic`
            under msrun.
    """
    from mindspore_hyper.pipeline.pipeline_model import PipelineModel

    explicit = pipeline is not None
    options = PipelineOptions.of(pipeline)
    if return_dtensor:
        raise ValueError("return_dtensor=True: a pipelined model returns the loss of train_step, not DTensors")
    if not runtime.runs_op_by_op():
        raise ValueError(f"pipeline execution: mode={runtime.name!r}; expected 'simulation' or 'distributed'")
    runtime.check_op_by_op("pipeline execution")
    runtime.check_composition("pipeline stages")
    try:
        layers = layers_of(model)
        message = None if layers is not None else (
            f"the model ({type(model).__name__}) is not a chain of layers (nn.SequentialCell, nn.WithLossCell over "
            f"one, a Cell with pipeline_layers(), or a construct looping over an nn.CellList of blocks), so its "
            f"pipeline stages cannot be cut")
    except ValueError as exc:
        message = str(exc).removeprefix("pipeline: ")
    if message is not None:
        return _not_pipelined(message, explicit)
    strategy = table.strategy
    mesh = strategy.mesh
    axis = options.axis
    if axis not in mesh.alias_names:
        raise ValueError(f"pipeline.axis={axis!r}: the strategy's mesh {mesh.alias_names} has no such axis; add the "
                         f"pipeline ranks as a mesh axis, e.g. Layout((2, 4), ('data', '{axis}'))")
    p = mesh.axis_size(axis)
    if options.stages is not None and options.stages != p:
        raise ValueError(f"pipeline.stages={options.stages}, but the mesh's {axis!r} axis has size {p}")
    if p < 2:
        raise ValueError(f"pipeline: the mesh's {axis!r} axis has size {p}; a pipeline needs at least 2 ranks")
    _check_no_pipeline_sharding(table, axis)
    v = options.num_chunks()
    m = options.microbatches if options.microbatches is not None else p * v
    try:
        schedule = build_schedule(options.schedule, p, m, v)
    except ValueError as exc:
        raise ValueError(f"pipeline (schedule={options.schedule!r}, stages={p}, microbatches={m}, chunks={v}): {exc}") \
            from None
    if options.layers_per_stage is not None:
        split = check_split(options.layers_per_stage, len(layers), p * v, "pipeline.layers_per_stage")
    else:
        split = (split_from_table(layers, table) if v == 1 else None) or \
            balanced_split(layers.weights(model), p * v)
    reduction = _reduction(options, layers)
    stage_mesh_size = mesh.size // p
    if layers.chain is not None and stage_mesh_size > 1 and not runtime.in_one_process():
        return _not_pipelined(f"the model ({type(model).__name__}) is pipelined through its construct (its "
                              f"nn.CellList {layers.chain.path!r}), which under msrun is supported on a pipeline-only "
                              f"mesh only (data/tensor axes besides the pipeline run in simulation); this mesh "
                              f"{mesh.device_matrix} {mesh.alias_names} has data/tensor axes besides {axis!r}", explicit)
    if runtime.in_one_process():
        runtime.check_mesh(mesh)
        return PipelineModel(model, layers, schedule, split, options, strategy, runtime, reduction, table,
                             from_config=not explicit)
    from mindspore_hyper.pipeline.stage_transport import ShmTransport, peer_pairs

    w = runtime.processes
    rebalance = options.rebalance or (options.rebalance is None and table.config is not None
                                      and table.config.scheduler == "dynamic")
    if stage_mesh_size > 1 and strategy.optimizer_state is not None:
        raise ValueError(f"optimizer_state={strategy.optimizer_state!r} (ZeRO-1) with pipeline stages under msrun is not "
                         f"supported; drop it or run in simulation")
    if stage_mesh_size > 1 and rebalance:
        raise ValueError("scheduler: dynamic (pipeline.rebalance) under msrun with data/tensor axes besides the pipeline "
                         "is not supported (moved layers would need resharding); use a pipeline-only mesh or simulation")
    runtime.check_mesh(mesh)
    check_unshared(layers, schedule, split)
    _broadcast_parameters(model, runtime)
    a = mesh.axis_index(axis)

    def process(pipeline_rank: int, like: int) -> int:
        coords = list(mesh.coords(like))
        coords[a] = pipeline_rank
        return mesh.rank_at(coords)

    pairs = sorted({(g, process(dst, g)) for src, dst in peer_pairs(schedule) for g in mesh.ranks
                    if mesh.coords(g)[a] == src})
    transport = ShmTransport(w, pairs, peer_of=lambda r: process(r, w.rank))
    return PipelineModel(model, layers, schedule, split, options, strategy, runtime, reduction, table,
                         transport=transport, from_config=not explicit)


def _not_pipelined(message: str, explicit: bool):
    """None with a warning (a config's `pipeline: N`: the caller runs the model as one SPMD
    program), or a ValueError when `pipeline=` asked for the pipeline explicitly."""
    if explicit:
        raise ValueError(f"pipeline: {message}")
    warnings.warn(f"{message}: it runs as one SPMD program in program order (stages only place parameters; "
                  f"pass pipeline=False to choose that without this warning)", UserWarning, stacklevel=4)
    return None


def _check_no_pipeline_sharding(table: StrategyTable, axis: str) -> None:
    """Refuse a strategy that splits a parameter or the inputs along the pipeline axis `axis` (a
    stage's tensors live on one pipeline rank). The resolved layouts decide, not the declaration: a
    default tensor map naming the axis at a position no parameter has (the seed's
    `("tensor", None, "pipeline")` on a model of matrices and vectors) splits nothing."""
    def uses(tmap) -> bool:
        return any(e == axis or (isinstance(e, tuple) and axis in e) for e in (tmap or ()))

    strategy = table.strategy
    index = table.mesh.axis_index(axis)
    split = [row.name for row in table if index in row.layout.sharded_axes()]
    if split:
        more = f" and {len(split) - 3} more" if len(split) > 3 else ""
        raise ValueError(f"the strategy shards tensors along {axis!r}, which holds the pipeline ranks; a stage's "
                         f"tensors live on one pipeline rank (split along it: {', '.join(split[:3])}{more})")
    if uses(strategy.input_map):
        raise ValueError(f"the strategy shards tensors along {axis!r}, which holds the pipeline ranks: "
                         f"input_map={strategy.input_map}; a stage's inputs live on one pipeline rank")
    if strategy.data_axis == axis:
        raise ValueError(f"data_axis={axis!r} is the pipeline axis")


def _reduction(options: PipelineOptions, layers) -> str:
    if options.loss_reduction is not None:
        return options.loss_reduction
    reduction = getattr(layers.loss, "reduction", "mean")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"pipeline: the loss's reduction is {reduction!r}; microbatch losses combine only by 'mean' "
                         f"or 'sum' (set pipeline.loss_reduction or the loss's reduction)")
    return reduction


def _broadcast_parameters(model, runtime) -> None:
    """Every process starts from rank 0's initial values (as if one model had been built)."""
    import numpy as np
    from mindspore import Tensor

    if runtime.processes.size == 1:
        return
    for _, param in model.parameters_and_names():
        value = runtime.broadcast_values(np.ascontiguousarray(param.asnumpy()), 0)
        param.set_data(Tensor(value, dtype=param.dtype))
