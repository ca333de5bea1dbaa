"""`HSDPModule`: what `fully_shard` makes a Cell (its class gains this base, as upstream's does),
with upstream's per-Cell settings.

`set_reduce_op_type` changes values (summed or averaged gradients) and acts. The prefetch setters
only choose which Cells' gathers are issued early, while another Cell computes: an order of
collectives, not their values; gathers here run when each Cell runs, so the setters check their
arguments and record them (`forward_prefetch`, `backward_prefetch`) with the same numerics.
"""
from __future__ import annotations

from typing import List, Sequence

from mindspore import nn

from mindspore_hyper.hyper_parallel.main_grad import clear_main_grads

__all__ = ["HSDPModule"]

REDUCE_OPS = ("sum", "avg")


def _cells(modules: Sequence[nn.Cell], what: str) -> List[nn.Cell]:
    if not isinstance(modules, (list, tuple)) or not all(isinstance(m, HSDPModule) for m in modules):
        raise ValueError(f"{what}: expected a list of fully_shard Cells, got {modules!r}")
    return list(modules)


class HSDPModule:
    """Upstream's interface of a fully_shard Cell (module docstring). `fsdp_state` is the
    Cell's FSDPModule record (fully_shard.py)."""

    def set_reduce_op_type(self, reduce_op_type: str) -> None:
        """How this Cell's gradients are reduced over the data-parallel ranks: "avg" (the
        default of fully_shard) or "sum" (no division by the group size).

        Raises:
            ValueError: another value.
        """
        op = reduce_op_type.lower().strip() if isinstance(reduce_op_type, str) else reduce_op_type
        if op not in REDUCE_OPS:
            raise ValueError(f"Unsupported reduce op type {reduce_op_type!r}, supported types are {list(REDUCE_OPS)}")
        self.fsdp_state.reduce = op

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """Torch FSDP2's gradient accumulation (upstream's fully_shard names it the same): while
        False, backwards reduce nothing and each rank's gradients add up unsynchronised (the
        Parameters' gradient they return is zero); the first backward with True reduces the sum
        once (`grad_accumulation.py`, "deferred"). Read when a Cell's forward runs.

        Args:
            requires_gradient_sync: False on all micro-batches but the last, True on the last.
            recurse: also set it on the fully_shard Cells inside this one (torch's default).

        Raises:
            ValueError: `requires_gradient_sync` or `recurse` not a bool.
        """
        if not isinstance(requires_gradient_sync, bool):
            raise ValueError(f"set_requires_gradient_sync: requires_gradient_sync must be bool but got "
                             f"{requires_gradient_sync!r}")
        if not isinstance(recurse, bool):
            raise ValueError(f"set_requires_gradient_sync: recurse must be bool but got {recurse!r}")
        cells = [cell for _, cell in self.cells_and_names()] if recurse else [self]
        for cell in cells:
            accumulation = getattr(getattr(cell, "fsdp_state", None), "accumulation", None)
            if isinstance(cell, HSDPModule) and accumulation is not None:
                accumulation.sync = requires_gradient_sync

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the `param.main_grad` buffers of this Cell's Parameters (fully_shard's
        `apply_grad_on_fp32_main_grad` policy): None, or zeros when `set_to_none` is False."""
        clear_main_grads(self, set_to_none)

    def set_modules_to_forward_prefetch(self, modules: Sequence[nn.Cell]) -> None:
        """Record the Cells whose gathers upstream issues early in the forward (same values).

        Raises:
            ValueError: not a list of fully_shard Cells.
        """
        object.__setattr__(self, "forward_prefetch", _cells(modules, "set_modules_to_forward_prefetch"))

    def set_modules_to_backward_prefetch(self, modules: Sequence[nn.Cell]) -> None:
        """Record the Cells whose gathers upstream issues early in the backward (same values).

        Raises:
            ValueError: not a list of fully_shard Cells.
        """
        object.__setattr__(self, "backward_prefetch", _cells(modules, "set_modules_to_backward_prefetch"))
