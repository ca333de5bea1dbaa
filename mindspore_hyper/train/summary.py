"""Step telemetry as MindSpore summary scalars (`mindspore.train.summary.SummaryRecord`), which
MindInsight and TensorBoard's MindSpore reader show.

Each step adds the scalars `loss`, `grad_norm`, `tokens_per_second`, `mfu`, `memory_peak_bytes`
(the largest device), `comm_bytes` and `comm_seconds` (those that are known) at the step's number.
It works on CPU in PyNative mode (tests/runtime/test_telemetry.py reads the event file back); where
MindSpore cannot open a SummaryRecord the error says so, naming `summary_dir`.
"""
from __future__ import annotations

import os
from typing import Optional

from mindspore_hyper.train.step_record import StepRecord

__all__ = ["SummaryOutput", "SCALARS"]

SCALARS = ("loss", "grad_norm", "tokens_per_second", "mfu", "memory_peak_bytes", "comm_bytes", "comm_seconds")


class SummaryOutput:
    """A SummaryRecord in `directory` taking StepRecords.

    Args:
        directory: the summary directory (created if missing).

    Raises:
        RuntimeError: MindSpore cannot open a SummaryRecord here (its reason, naming summary_dir).
    """

    def __init__(self, directory: str):
        self.directory = os.fspath(directory)
        try:
            from mindspore.train.summary import SummaryRecord

            os.makedirs(self.directory, exist_ok=True)
            self._record = SummaryRecord(self.directory, network=None)
        except Exception as exc:  # MindSpore's refusal, whatever its type: said with the option's name
            raise RuntimeError(f"summary_dir={self.directory!r}: MindSpore's SummaryRecord cannot be opened here "
                               f"({type(exc).__name__}: {exc}); leave summary_dir unset") from exc

    def write(self, record: StepRecord) -> None:
        """Add the record's known scalars at its step."""
        import mindspore as ms
        from mindspore import Tensor

        values = {"loss": record.loss, "grad_norm": record.grad_norm, "tokens_per_second": record.tokens_per_second,
                  "mfu": record.mfu, "memory_peak_bytes": max(record.memory_peak.values()) if record.memory_peak
                  else None, "comm_bytes": record.comm_bytes, "comm_seconds": record.comm_seconds}
        for name in SCALARS:
            if values[name] is not None:
                self._record.add_value("scalar", name, Tensor(float(values[name]), ms.float32))
        self._record.record(record.step)

    def close(self) -> None:
        """Flush and close the event file."""
        record: Optional[object] = getattr(self, "_record", None)
        if record is not None:
            record.close()
            self._record = None
