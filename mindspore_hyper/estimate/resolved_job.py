"""The JobStrategy a resolved strategy amounts to: sizes and ZeRO stage read off the StrategyTable.

The estimator sees a job as sizes (`JobStrategy`: data, tensor, pipeline, ZeRO stage); the
runtimes run a resolved `StrategyTable` (every parameter's layout and optimizer layout). Deriving
the first from the second makes an estimate describe the layout that really runs (the cross-check
estimates from the table the simulation resolved) instead of trusting a conversion the other way:

- pipeline: the table's pipeline stages;
- data: the size of the strategy's data axis (1 without one);
- tensor: the size of the one other mesh axis (not the data or pipeline axis) that splits a
  parameter (1 when none does);
- ZeRO stage: 3 when parameters are split along the data axis, else 1 when optimizer states are
  (ZeRO-1), else 0.

What sizes cannot say is refused: a second splitting axis, a mesh axis of size > 1 that is none of
data, tensor or pipeline, context parallelism, device groups, ZeRO along another axis than data.
"""
from __future__ import annotations

from typing import Any, Set

from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["job_strategy_of", "DERIVED_FIELDS"]

DERIVED_FIELDS = ("data", "tensor", "pipeline", "zero_stage")  # the JobStrategy fields read off the table


def _axis_names(mesh, axes) -> Set[str]:
    return {mesh.alias_names[a] for a in axes}


def job_strategy_of(table, **fields: Any) -> JobStrategy:
    """The JobStrategy of a resolved strategy (module docstring).

    Args:
        table: a `StrategyTable` (`mindspore_hyper.strategy.resolve_strategy`'s result).
        **fields: the JobStrategy's other fields (recompute, activation_model, ...); the derived
            ones (data, tensor, pipeline, zero_stage) may not be given; optimizer_states defaults
            to the table's.

    Returns:
        The JobStrategy.

    Raises:
        ValueError: a derived field given in `fields`; a table that sizes cannot describe (see
            module docstring), naming the axis or parameter.
    """
    derived = set(DERIVED_FIELDS)
    if derived & set(fields):
        raise ValueError(f"job_strategy_of: {', '.join(sorted(derived & set(fields)))} come from the table; "
                         f"pass only the other JobStrategy fields")
    if table.groups:
        raise ValueError("job_strategy_of: the strategy declares device groups (an MPMD program); a JobStrategy "
                         "describes one SPMD program")
    strategy, mesh = table.strategy, table.mesh
    if strategy.context is not None:
        raise ValueError(f"job_strategy_of: context parallelism over {strategy.context.axis!r} is not derived")
    sizes = dict(zip(mesh.alias_names, mesh.device_matrix))
    data_axis = strategy.data_axis
    pipeline_axis = table.config.pipeline_axis if table.config is not None else None
    splitting: Set[str] = set()
    zero_axes: Set[str] = set()
    for row in table:
        split = _axis_names(mesh, row.layout.sharded_axes())
        splitting |= split - {data_axis}
        zero_axes |= _axis_names(mesh, row.optimizer_layout.sharded_axes()) - split
    tensor_axes = {a for a in splitting if sizes[a] > 1}
    if len(tensor_axes) > 1:
        raise ValueError(f"job_strategy_of: parameters are split along {sorted(tensor_axes)}; a JobStrategy has one "
                         f"tensor axis")
    tensor_axis = next(iter(tensor_axes), None)
    for name, size in sizes.items():
        if size > 1 and name not in (data_axis, pipeline_axis, tensor_axis):
            raise ValueError(f"job_strategy_of: mesh axis {name!r} of size {size} is none of data ({data_axis!r}), "
                             f"tensor or pipeline ({pipeline_axis!r})")
    if zero_axes - {data_axis}:
        raise ValueError(f"job_strategy_of: optimizer states split along {sorted(zero_axes - {data_axis})}; ZeRO "
                         f"is derived along the data axis {data_axis!r} only")
    zero3 = any(data_axis in _axis_names(mesh, row.layout.sharded_axes()) for row in table)
    zero_stage = 3 if zero3 else 1 if data_axis in zero_axes else 0
    fields.setdefault("optimizer_states", table.optimizer_states)
    return JobStrategy(data=sizes.get(data_axis, 1), tensor=sizes[tensor_axis] if tensor_axis else 1,
                       pipeline=table.pipeline_stages, zero_stage=zero_stage, **fields)
