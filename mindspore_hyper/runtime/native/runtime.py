"""The native runtime: MindSpore's own semi-auto parallel compiles and runs the strategy.

MindSpore slices parameters and runs collectives itself (Ascend/GPU), so this runtime only
wraps the model; it holds no DTensor shards and has no collectives of its own.
"""
from __future__ import annotations

import os
from typing import Tuple

from mindspore_hyper.runtime.base import Runtime
from mindspore_hyper.shard.layout import Layout

__all__ = ["NativeRuntime"]

NATIVE_KEYWORDS = ("example_inputs", "loss_fn", "optimizer", "micro_batches", "pipeline_scheduler", "parallel_mode")


class NativeRuntime(Runtime):
    """Strategies translated to `Primitive.shard` / `AutoParallel` (see translate.py)."""

    name = "native"

    def local_ranks(self, mesh: Layout) -> Tuple[int, ...]:
        """The process's rank under msrun (MindSpore places it; 0 outside a job)."""
        return (int(os.environ.get("RANK_ID", "0")),)

    def make_collectives(self, mesh: Layout):
        raise NotImplementedError("native mode: MindSpore's compiled graph runs the collectives; "
                                  "DTensor collectives exist in 'simulation' and 'distributed' modes")

    def materialize(self, network, param, row):
        raise NotImplementedError("native mode: MindSpore slices parameters itself when it compiles the graph")

    def parallelize(self, model, table, **options):
        """Translate the resolved `table` (`apply_native`); the keyword arguments are those of
        `apply_native`.

        Raises:
            TypeError: a keyword `apply_native` does not take (named).
        """
        from mindspore_hyper.runtime.native.translate import apply_native

        unknown = [k for k in options if k not in NATIVE_KEYWORDS]
        if unknown:
            raise TypeError(f"auto_parallelize(mode='native'): unexpected keyword {unknown[0]!r}; expected one of "
                            f"{NATIVE_KEYWORDS + ('optimizer_states',)}")
        return apply_native(model, table, **options)
