"""`ContextParallel`: HyperParallel's context-parallel style for a core-attention Cell (q, k, v in,
attention out), with upstream's semantics on a one-dimensional context-parallel mesh.

The Cell receives q, k and v split along the sequence (`seq_dim`): a rank's local shard (under
msrun; in simulation a rank-local value from `to_local()`) or a DTensor on the mesh (any
placement: it is redistributed from there).
- Ulysses (`ulysses_degree` None or the mesh size): q, k and v go sequence -> head sharded by one
  AllToAll each, attention runs on whole sequences of 1/cp of the heads, and the output goes
  head -> sequence sharded (one AllToAll). The heads must divide by the mesh size.
- Colossal-AI style (`ulysses_degree=1`): q stays sequence sharded, k and v are all-gathered, so
  each rank attends its query rows to every key; no head-count constraint.
The output is returned local (sequence shard), as upstream returns it. The attention itself is
the Cell's own code on DTensors, so its numerics are the single-device ones up to float32
summation order. Hybrid degrees (1 < ulysses_degree < mesh size) and `load_balance` are refused.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from mindspore import nn

from mindspore_hyper.comm.collective_cause import set_cause
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh
from mindspore_hyper.hyper_parallel.tensor_parallel import ParallelStyle
from mindspore_hyper.shard.placement import Replicate, Shard

__all__ = ["ContextParallel"]


class ContextParallel(ParallelStyle):
    """Context parallelism for a core-attention Cell (see module docstring).

    Args:
        seq_dim: the sequence dimension of q, k, v and the output (1 for BSHD, 2 for BNSD).
        head_dim: the head dimension (2 for BSHD, 1 for BNSD).
        ulysses_degree: None or the mesh size (Ulysses), or 1 (all-gathered k and v).
        qkv_indices: the positions of q, k, v among the Cell's positional inputs.
        qkv_kwarg_names: the keyword names of q, k, v, when passed by keyword.
        load_balance: upstream's head-tail query exchange; refused here.

    Raises:
        ValueError: `load_balance`, equal `seq_dim` and `head_dim`, or three q/k/v positions not given.
    """

    def __init__(self, seq_dim: int = 1, head_dim: int = 2, ulysses_degree: Optional[int] = None,
                 qkv_indices: Sequence[int] = (0, 1, 2), qkv_kwarg_names: Sequence[str] = (),
                 load_balance: bool = False):
        if load_balance:
            raise ValueError("ContextParallel(load_balance=True): the head-tail query exchange is not provided by "
                             "mindspore_hyper yet; leave load_balance=False (causal masks still hold, unbalanced)")
        if seq_dim == head_dim:
            raise ValueError(f"ContextParallel: seq_dim and head_dim are both {seq_dim}; expected two dimensions")
        if len(tuple(qkv_indices)) != 3 or (qkv_kwarg_names and len(tuple(qkv_kwarg_names)) != 3):
            raise ValueError(f"ContextParallel: qkv_indices={tuple(qkv_indices)}, qkv_kwarg_names="
                             f"{tuple(qkv_kwarg_names)}: expected three positions (q, k, v) and, if given, three names")
        self.seq_dim, self.head_dim = seq_dim, head_dim
        self.ulysses_degree = ulysses_degree
        self.qkv_indices, self.qkv_kwarg_names = tuple(qkv_indices), tuple(qkv_kwarg_names)

    def _apply(self, module: nn.Cell, mesh: DeviceMesh) -> nn.Cell:
        cp = mesh.size()
        degree = cp if self.ulysses_degree is None else self.ulysses_degree
        if degree not in (1, cp):
            raise ValueError(f"ContextParallel(ulysses_degree={self.ulysses_degree}) on a mesh of {cp}: hybrid "
                             f"Ulysses x all-gather is not provided by mindspore_hyper yet; use ulysses_degree=None "
                             f"(Ulysses over all {cp}) or 1 (all-gathered k and v)")
        ulysses = degree == cp and cp > 1
        inner, style = module.construct, self
        cause = f"ContextParallel ({'Ulysses' if ulysses else 'all-gathered k/v'}) of {type(module).__name__}"

        def construct(*args, **kwargs):
            previous = set_cause(cause)
            try:
                args, kwargs = style._inputs(list(args), dict(kwargs), mesh, ulysses)
                out = inner(*args, **kwargs)
                return style._outputs(out, mesh, ulysses)
            finally:
                set_cause(previous)

        object.__setattr__(module, "construct", construct)
        return module

    def _inputs(self, args: list, kwargs: dict, mesh: DeviceMesh, ulysses: bool) -> Tuple[tuple, dict]:
        slots = [(args, i) for i in self.qkv_indices if i < len(args)] + \
                [(kwargs, name) for name in self.qkv_kwarg_names if name in kwargs]
        if len(slots) != 3:
            raise ValueError(f"ContextParallel: expected q, k, v at positions {self.qkv_indices} or keywords "
                             f"{self.qkv_kwarg_names}; the Cell got {len(args)} positional inputs and keywords "
                             f"{sorted(kwargs)}")
        for role, (holder, key) in zip("qkv", slots):
            value = self._sequence_sharded(holder[key], mesh, role)
            if ulysses:
                heads = value.shape[self.head_dim]
                if heads % mesh.size():
                    raise ValueError(f"ContextParallel (Ulysses over {mesh.size()}): {role} has {heads} heads "
                                     f"(dimension {self.head_dim}); expected a multiple of {mesh.size()} "
                                     "(or ulysses_degree=1)")
                value = value.redistribute(mesh, (Shard(self.head_dim),))
            else:
                value = value.redistribute(mesh, (Shard(self.seq_dim),) if role == "q" else (Replicate(),))
            holder[key] = value
        return tuple(args), kwargs

    def _sequence_sharded(self, value, mesh: DeviceMesh, role: str) -> DTensor:
        """A local (rank-local) input as the DTensor it is a sequence shard of; a DTensor as it is
        (any placement on this mesh: the redistribution to what attention needs starts from it)."""
        if not isinstance(value, DTensor) or value.layout.is_rank_local:
            return DTensor.from_local(value, mesh, (Shard(self.seq_dim),))
        if value.device_mesh.mesh_dim_names != mesh.mesh_dim_names or value.device_mesh.size() != mesh.size():
            raise ValueError(f"ContextParallel: {role} is a DTensor on {value.device_mesh!r}; expected one on the "
                             f"context-parallel mesh {mesh!r}")
        return value

    def _outputs(self, out, mesh: DeviceMesh, ulysses: bool):
        def local(value):
            if not isinstance(value, DTensor):
                return value
            if ulysses:
                value = value.redistribute(mesh, (Shard(self.seq_dim),))
            return value.to_local()
        if isinstance(out, (tuple, list)):
            return type(out)(local(o) for o in out)
        return local(out)
