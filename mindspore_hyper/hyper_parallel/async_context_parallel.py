"""`AsyncContextParallel`: upstream's context parallelism whose q/k/v collectives start inside the
projections' hooks so they overlap the projection matmuls, with the values of `ContextParallel`.

Upstream launches the sequence -> head AllToAll (or the k/v AllGather) asynchronously when a
q/k/v projection returns and waits for it just before the core attention runs; without the
projections it falls back to the synchronous `ContextParallel`. The collectives move the same
values either way: only when they run differs, and on CPU nothing overlaps. So here `apply` runs
the synchronous style on the core-attention Cell and uses the projections only to check them;
the numerics are `ContextParallel`'s (equal to one device up to float32 summation order), and the
report counts the same collectives. What `ContextParallel` refuses (hybrid degrees,
`load_balance`) is refused here too.
"""
from __future__ import annotations

from typing import Optional, Sequence

from mindspore import nn

from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.hyper_parallel.context_parallel import ContextParallel
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh
from mindspore_hyper.shard.placement import Shard

__all__ = ["AsyncContextParallel"]


class AsyncContextParallel(ContextParallel):
    """Context parallelism with upstream's projection/collective overlap (module docstring).

    Args:
        seq_dim, head_dim, ulysses_degree, qkv_indices, qkv_kwarg_names, load_balance: as
            `ContextParallel`'s.
        use_local_output: True: the attention output is returned as this rank's sequence shard
            (a local tensor); False (upstream's default here): as a DTensor split along `seq_dim`
            on the context-parallel mesh.

    Raises:
        ValueError: as `ContextParallel`; `use_local_output` not a bool.
    """

    def __init__(self, seq_dim: int = 1, head_dim: int = 2, ulysses_degree: Optional[int] = None,
                 qkv_indices: Sequence[int] = (0, 1, 2), qkv_kwarg_names: Sequence[str] = (),
                 use_local_output: bool = False, load_balance: bool = False):
        super().__init__(seq_dim=seq_dim, head_dim=head_dim, ulysses_degree=ulysses_degree, qkv_indices=qkv_indices,
                         qkv_kwarg_names=qkv_kwarg_names, load_balance=load_balance)
        if not isinstance(use_local_output, bool):
            raise ValueError(f"AsyncContextParallel: use_local_output must be a bool, got {use_local_output!r}")
        self.use_local_output = use_local_output

    def apply(self, module: nn.Cell, device_mesh: DeviceMesh, q_proj: Optional[nn.Cell] = None,
              k_proj: Optional[nn.Cell] = None, v_proj: Optional[nn.Cell] = None) -> nn.Cell:
        """Make `module` (the core attention) context parallel on `device_mesh`.

        Args:
            module: the core-attention Cell (q, k, v in, attention out).
            device_mesh: the one-dimensional context-parallel mesh.
            q_proj, k_proj, v_proj: the Cells whose outputs feed q, k, v (upstream starts the
                collectives in their hooks); all three or none.

        Returns:
            `module`, changed in place.

        Raises:
            ValueError: only some of the projections given, or one that is not a Cell; what
                `ContextParallel.apply` raises.
        """
        projections = {"q_proj": q_proj, "k_proj": k_proj, "v_proj": v_proj}
        given = [name for name, cell in projections.items() if cell is not None]
        if given and len(given) != 3:
            raise ValueError(f"AsyncContextParallel.apply: got {given} only; pass q_proj, k_proj and v_proj together "
                             "(or none: the synchronous path)")
        for name in given:
            if not isinstance(projections[name], nn.Cell):
                raise ValueError(f"AsyncContextParallel.apply: {name} must be an nn.Cell, got "
                                 f"{type(projections[name]).__name__}")
        return super().apply(module, device_mesh)

    def _outputs(self, out, mesh: DeviceMesh, ulysses: bool):
        if self.use_local_output:
            return super()._outputs(out, mesh, ulysses)

        def kept(value):
            if isinstance(value, DTensor):
                return value.redistribute(mesh, (Shard(self.seq_dim),))
            return value

        if isinstance(out, (tuple, list)):
            return type(out)(kept(o) for o in out)
        return kept(out)
