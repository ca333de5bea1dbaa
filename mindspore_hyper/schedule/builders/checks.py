"""Argument checks the schedule families share; each raises ValueError naming the argument."""
from __future__ import annotations

__all__ = ["require_one_chunk", "require_microbatches_at_least_stages"]


def require_one_chunk(kind: str, num_chunks: int) -> None:
    if num_chunks != 1:
        raise ValueError(f"num_chunks={num_chunks}: {kind!r} places one stage per rank, expected num_chunks=1 "
                         f"(use 'interleaved_1f1b' or 'zb_v' for several chunks per rank)")


def require_microbatches_at_least_stages(kind: str, num_stages: int, num_microbatches: int) -> None:
    if num_microbatches < num_stages:
        raise ValueError(f"num_microbatches={num_microbatches}: {kind!r} needs at least num_stages={num_stages} "
                         f"microbatches; with fewer, the last ranks would wait for a warm-up the first rank "
                         f"never completes and no steady one-forward-one-backward phase exists (use 'gpipe')")
