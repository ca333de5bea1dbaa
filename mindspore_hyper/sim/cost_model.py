"""Time estimate of the simulation's collectives from the communication library's alpha-beta
model over the `topology` context flag."""
from __future__ import annotations

from typing import Sequence

from mindspore_hyper.comm.cost import estimate_time
from mindspore_hyper.context import get_context

__all__ = ["collective_time"]

_LIBRARY_KIND = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
                 "AllToAll": "all_to_all", "Broadcast": "broadcast"}


def collective_time(kind: str, input_bytes: int, group_ranks: Sequence[int]) -> float:
    """Seconds for one collective of a plan-step `kind` whose per-device input is `input_bytes`."""
    nbytes = input_bytes * len(group_ranks) if kind == "AllGather" else input_bytes
    return estimate_time(_LIBRARY_KIND[kind], int(nbytes), list(group_ranks), get_context("topology"))
