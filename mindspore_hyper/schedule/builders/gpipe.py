"""GPipe: every rank runs all forwards, then all (full) backwards in microbatch order."""
from __future__ import annotations

from mindspore_hyper.schedule.actions import ActionKind
from mindspore_hyper.schedule.builders.common import assemble
from mindspore_hyper.schedule.builders.checks import require_one_chunk
from mindspore_hyper.schedule.schedule import Schedule

__all__ = ["build_gpipe"]


def build_gpipe(num_stages: int, num_microbatches: int, num_chunks: int) -> Schedule:
    """GPipe on p = num_stages ranks, stage s on rank s; all m activations are alive at the peak."""
    require_one_chunk("gpipe", num_chunks)
    orders = []
    for rank in range(num_stages):
        forwards = [(ActionKind.FORWARD, rank, mb) for mb in range(num_microbatches)]
        backwards = [(ActionKind.BACKWARD, rank, mb) for mb in range(num_microbatches)]
        orders.append(forwards + backwards)
    return assemble("gpipe", num_microbatches, tuple(range(num_stages)), orders)
