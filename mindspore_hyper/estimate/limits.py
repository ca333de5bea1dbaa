"""What fits a device: the largest micro-batch and the longest sequence under a memory budget."""
from __future__ import annotations

from mindspore_hyper.estimate.job import estimate_job
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["largest_fitting", "FIT_FIELDS"]

FIT_FIELDS = ("micro_batch", "seq_len")
_LIMIT = 1 << 40  # a search bound far beyond any real size


def _needs(config: TransformerConfig, strategy: JobStrategy) -> int:
    return estimate_job(config, strategy).peak.total


def largest_fitting(config: TransformerConfig, strategy: JobStrategy, device_memory: int,
                    field: str = "micro_batch") -> int:
    """The largest value of `field` whose every stage fits `device_memory` (0 when 1 step does not fit).

    Memory grows with both fields, so a doubling search then a bisection finds the boundary.
    The sequence length moves in steps of the context-parallel size (times the tensor-parallel
    size with sequence parallelism).

    Args:
        config: the model; `field` is varied, everything else kept.
        strategy: the job's strategy.
        device_memory: per-device budget in bytes.
        field: "micro_batch" or "seq_len".

    Returns:
        The largest fitting value (a multiple of the step), or 0.

    Raises:
        ValueError: unknown field, a budget < 1, or config and strategy that do not fit together.
    """
    if field not in FIT_FIELDS:
        raise ValueError(f"field={field!r}: expected one of {', '.join(map(repr, FIT_FIELDS))}")
    if isinstance(device_memory, bool) or not isinstance(device_memory, int) or device_memory < 1:
        raise ValueError(f"device_memory={device_memory!r}: expected a byte count >= 1")
    step = 1
    if field == "seq_len":  # the context chunk s / cp must divide by t under sequence parallelism
        step = strategy.context_parallel * (strategy.tensor if strategy.sequence_parallel else 1)

    def fits(units: int) -> bool:
        return _needs(config.with_(**{field: units * step}), strategy) <= device_memory

    if not fits(1):
        return 0
    low, high = 1, 2
    while high * step < _LIMIT and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low * step
