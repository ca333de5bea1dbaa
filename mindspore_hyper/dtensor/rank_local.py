"""Ops on rank-local values: each rank's own tensor, run rank by rank with no sharding rule.

A process that holds several ranks (the simulation) gets a rank-local value from
`DTensor.to_local()` when the ranks' shards differ: a DTensor whose layout marks the mesh axes
along which the values differ (`TensorLayout.rank_local`) and whose shape is the local shape.
An op with such an operand runs once per distinct rank value, on the local tensors, as each
device would run it; its results are rank-local too. `DTensor.from_local` turns the values back
into a global DTensor. Under msrun a process holds one rank and `to_local()` is a plain tensor.

Refused (never a silently different result):
- mixing a rank-local value with a DTensor that is sharded or Partial (as torch refuses mixing
  DTensor and local tensors): the op has no per-rank meaning the global DTensor agrees with;
- a model Parameter that no layout covers read by rank-local work: each rank would compute its
  own gradient for it, which one global Parameter cannot hold.
"""
from __future__ import annotations

from typing import Optional

from mindspore import Parameter

from mindspore_hyper.dtensor.dtensor import DTensor, key_of, significant_axes
from mindspore_hyper.dtensor.rules.registry import Decision
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["rank_local_decision", "RankLocalError"]


class RankLocalError(ValueError):
    """An op mixes rank-local values with values they cannot be combined with."""


def rank_local_decision(call) -> Optional[Decision]:
    """The decision for a call with a rank-local operand (every operand keeps its layout; the
    results are rank-local along the union of the operands' axes), or None without one.

    Raises:
        RankLocalError: a sharded or Partial DTensor operand, or an unlaid-out Parameter.
    """
    local = [t for t in call.tensors if t.layout.is_rank_local]
    if not local:
        return None
    for t, source in zip(call.tensors, call.sources):
        if t.layout.is_rank_local:
            continue
        if significant_axes(t.layout):
            raise RankLocalError(
                f"{call.name}: mixes a rank-local tensor (from DTensor.to_local()) with a DTensor laid out as "
                f"{t.layout}; turn the local tensor back with DTensor.from_local(local, device_mesh, placements) "
                "or take the DTensor's local part with .to_local()")
        if isinstance(source, Parameter) and source.requires_grad and t._parameter_id is None:
            raise RankLocalError(
                f"{call.name}: Parameter {source.name!r} is read by rank-local work (values from DTensor.to_local() "
                "that differ per rank); each rank would get its own gradient, which one Parameter cannot hold in "
                "simulation. Lay the parameter out (parallelize_module, distribute_module, fully_shard) so the "
                "op runs on DTensors, or run under msrun")
    mesh = call.tensors[0].layout.mesh
    axes = sorted(set().union(*[significant_axes(t.layout) for t in local]))

    def outputs(ndim: int) -> TensorLayout:
        return TensorLayout.rank_local(mesh, ndim, axes)

    def run(op_call, local_inputs, coords):
        kwargs = {k: v.shards[key_of(coords, significant_axes(v.layout))] if isinstance(v, DTensor) else v
                  for k, v in op_call.kwargs.items()}
        return op_call.run(local_inputs, kwargs)

    # without DTensor keywords the op runs as given on each rank's tensors, so the batched path may
    # run it once over the stacked rank values
    keywords = any(isinstance(v, DTensor) for v in call.kwargs.values())
    return Decision(inputs=[t.layout for t in call.tensors], outputs=outputs, local_fn=run if keywords else None)
