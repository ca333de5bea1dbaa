"""`StepRecord`: the figures of one training step, and the one place they are computed.

From the caller: the loss, the tokens of the step (the global batch's), its seconds; from the
model: `last_grad_norm` (the global gradient norm of the last `train_step`, when the model keeps
it) and `report()` (a StepReport: per-device memory of the step, with the peak live activations,
and the collectives each device sent, forward and backward, with the cost model's time for them).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional

from mindspore_hyper.train.mfu import model_flops_utilization
from mindspore_hyper.units import format_bytes

__all__ = ["StepRecord"]


@dataclass(frozen=True)
class StepRecord:
    """One step's telemetry.

    Attributes:
        step: the step's number.
        loss: the loss.
        grad_norm: the global gradient norm (`model.last_grad_norm`), or None when unknown.
        tokens: tokens processed in the step (all data-parallel ranks).
        seconds: the step's wall time.
        tokens_per_second: tokens / seconds.
        model_flops: FLOPs per token x tokens, or None without FLOPs per token.
        mfu: model_flops / (seconds x devices x peak FLOP/s), or None without both figures.
        devices: the devices MFU divides by.
        memory_peak: device rank -> bytes it held at the step's peak (parameters, gradients,
            optimizer states and peak live activations: StepReport's "total").
        comm_bytes: bytes a device sent in the step's collectives, forward and backward
            (StepReport's per-device bytes summed over collective kinds and mesh axes).
        comm_seconds: the cost model's time of those collectives (StepReport.comm_time_estimate_s).
    """

    step: int
    loss: float
    grad_norm: Optional[float]
    tokens: int
    seconds: float
    tokens_per_second: float
    model_flops: Optional[float] = None
    mfu: Optional[float] = None
    devices: int = 1
    memory_peak: Dict[int, int] = field(default_factory=dict)
    comm_bytes: int = 0
    comm_seconds: float = 0.0

    @classmethod
    def compute(cls, step: int, loss: Any, tokens: int, seconds: float, *, grad_norm: Any = None,
                flops_per_token: Optional[float] = None, peak_flops: Optional[float] = None, devices: int = 1,
                report: Any = None) -> "StepRecord":
        """The record of a step from its raw figures (see the attributes for each formula).

        Raises:
            ValueError: seconds not > 0, tokens not an int >= 0 (named).
        """
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"tokens={tokens!r}: expected an int >= 0 (tokens in the step, all ranks)")
        if not seconds > 0:
            raise ValueError(f"seconds={seconds!r}: expected > 0")
        norm = None if grad_norm is None else float(grad_norm)
        if norm is not None and math.isnan(norm):
            norm = None  # the model has not computed one yet
        flops = None if flops_per_token is None else flops_per_token * tokens
        utilisation = None
        if flops_per_token is not None and peak_flops is not None:
            utilisation = model_flops_utilization(flops_per_token, tokens, seconds, devices, peak_flops)
        memory, comm_bytes, comm_seconds = {}, 0, 0.0
        if report is not None:
            memory = {int(rank): int(m["total"]) for rank, m in report.memory.items()}
            comm_bytes = sum(v["bytes"] for comm in (report.comm, report.comm_backward)
                             for axes in comm.values() for v in axes.values())
            comm_seconds = float(report.comm_time_estimate_s)
        return cls(step, float(loss), norm, tokens, float(seconds), tokens / seconds, flops, utilisation, devices,
                   memory, int(comm_bytes), comm_seconds)

    def line(self) -> str:
        """One log line: step, loss, grad norm, tokens/s, MFU, peak memory, communication."""
        parts = [f"step {self.step}", f"loss {self.loss:.4f}"]
        parts.append("grad_norm n/a" if self.grad_norm is None else f"grad_norm {self.grad_norm:.4g}")
        parts.append(f"{self.tokens_per_second:,.0f} tok/s")
        parts.append("mfu n/a" if self.mfu is None else f"mfu {100 * self.mfu:.3g}%")
        if self.memory_peak:
            parts.append(f"peak mem {format_bytes(max(self.memory_peak.values()))}/device")
        parts.append(f"comm {format_bytes(self.comm_bytes)} ~{1e3 * self.comm_seconds:.3g} ms")
        return " | ".join(parts)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)
