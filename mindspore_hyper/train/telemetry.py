"""`Telemetry`: what a training loop calls once per step to log loss, grad norm, tokens/s, MFU,
per-device peak memory and communication (docs/training.md, "Telemetry").

    telemetry = Telemetry(config=gpt_config, hardware="a100-80gb", total_steps=1000)
    for step in range(1000):
        loss = model.train_step(optimizer, *next(loader))
        telemetry.step(model, loss, tokens=loader.tokens_per_batch)
    telemetry.close()

Each call makes a `StepRecord` (its figures and formulas: step_record.py; MFU: mfu.py), keeps it
in `records`, writes its line to the stream every `log_every` steps, redraws the progress bar on
long runs (`progress.py`) and adds the scalars to a MindSpore SummaryRecord when `summary_dir`
is given (`summary.py`). A step's seconds are the wall time since the previous call (or since the
Telemetry was made or `start()` last called), unless given. Under msrun only the process that
holds rank 0 prints and writes the summary (`all_ranks=True`: every process); every process keeps
its records.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, List, Optional, TextIO, Union

from mindspore_hyper.estimate.hardware import Hardware
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.train.mfu import CPU, flops_per_token_of, peak_flops_of
from mindspore_hyper.train.progress import ProgressBar
from mindspore_hyper.train.step_record import StepRecord
from mindspore_hyper.train.summary import SummaryOutput

__all__ = ["Telemetry", "LONG_RUN"]

LONG_RUN = 50  # total_steps from which progress=None draws a bar (on a terminal)


class Telemetry:
    """Per-step training telemetry (see module docstring).

    Args:
        flops_per_token: training FLOPs per token of the model (MFU's numerator), or
        config: a GPT-like `estimate.TransformerConfig` whose FLOPs per token the estimator gives.
        peak_flops: peak FLOP/s per device, or
        hardware: a hardware preset name (configs/hardware), a YAML path, a `Hardware`, or "cpu"
            (this machine, measured once now by `calibrate_cpu`). Without FLOPs or a peak, MFU is None.
        devices: the devices MFU divides by; None: the model's mesh size, except with
            hardware="cpu" when one process computes every device (simulation): 1.
        total_steps: the run's length (for the progress bar).
        log_every: write a step's line every this many steps; None: never.
        progress: draw a progress bar (needs total_steps); None: when total_steps >= LONG_RUN and
            the stream is a terminal.
        stream: where lines and the bar go (default sys.stderr).
        summary_dir: also write MindSpore summary scalars there (SummaryRecord), or None.
        report: read `model.report()` each step (memory, communication); False skips it.
        all_ranks: under msrun, every process prints (default: only the one holding rank 0).
        clock: seconds since some origin (injectable for tests).

    Raises:
        ValueError: bad figures or options (named). RuntimeError: summary_dir where MindSpore's
            SummaryRecord cannot be opened.
    """

    def __init__(self, *, flops_per_token: Optional[float] = None, config: Optional[TransformerConfig] = None,
                 peak_flops: Optional[float] = None, hardware: Union[None, str, Hardware, dict] = None,
                 devices: Optional[int] = None, total_steps: Optional[int] = None, log_every: Optional[int] = 1,
                 progress: Optional[bool] = None, stream: Optional[TextIO] = None, summary_dir: Optional[str] = None,
                 report: bool = True, all_ranks: bool = False, clock: Callable[[], float] = time.perf_counter):
        self.flops_per_token = flops_per_token_of(flops_per_token, config)
        self.peak_flops, self.peak_source = peak_flops_of(peak_flops, hardware)
        self._cpu = hardware == CPU
        for name, value in (("devices", devices), ("total_steps", total_steps), ("log_every", log_every)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r}: expected an int >= 1 or None")
        self.devices, self.total_steps, self.log_every = devices, total_steps, log_every
        self.stream = sys.stderr if stream is None else stream
        if progress and total_steps is None:
            raise ValueError("progress=True: needs total_steps= (the bar's length)")
        if progress is None:
            isatty = getattr(self.stream, "isatty", None)
            progress = total_steps is not None and total_steps >= LONG_RUN and bool(isatty and isatty())
        self.bar = ProgressBar(total_steps, self.stream, clock=clock) if progress else None
        self.summary = SummaryOutput(summary_dir) if summary_dir is not None else None
        self.read_report, self.all_ranks, self.clock = report, all_ranks, clock
        self.records: List[StepRecord] = []
        self._last = clock()

    def start(self) -> None:
        """Start the next step's clock now (call after the set-up, before the first step)."""
        self._last = self.clock()

    def _devices(self, model: Any) -> int:
        if self.devices is not None:
            return self.devices
        runtime = getattr(model, "runtime", None)
        if self._cpu and runtime is not None and runtime.in_one_process():  # the simulation's virtual devices
            return 1
        mesh = getattr(model, "mesh", None)
        return mesh.size if mesh is not None else 1

    def _speaks(self, model: Any) -> bool:
        ranks = getattr(model, "local_ranks", (0,))
        return self.all_ranks or 0 in ranks

    def step(self, model: Any, loss: Any, tokens: int, *, seconds: Optional[float] = None,
             step: Optional[int] = None, optimizer: Any = None) -> StepRecord:
        """Record one step: after `train_step` returned `loss`.

        Args:
            model: the ParallelModel (its `last_grad_norm` and `report()` are read), or any Cell.
            loss: the step's loss (a Tensor or a number).
            tokens: tokens in the step, all data-parallel ranks (`ShardedLoader.tokens_per_batch`).
            seconds: the step's wall time; None: since the previous call (or `start()`).
            step: the step's number; None: the previous + 1 (0 first).
            optimizer: passed to `model.report()` (optimizer states counted at their real size).

        Returns:
            The StepRecord (also appended to `records`).
        """
        now = self.clock()
        if seconds is None:
            seconds = now - self._last
        number = step if step is not None else (self.records[-1].step + 1 if self.records else 0)
        report = None
        if self.read_report and callable(getattr(model, "report", None)):
            report = model.report(optimizer) if optimizer is not None else model.report()
        record = StepRecord.compute(number, loss, tokens, seconds, grad_norm=getattr(model, "last_grad_norm", None),
                                    flops_per_token=self.flops_per_token, peak_flops=self.peak_flops,
                                    devices=self._devices(model), report=report)
        self.records.append(record)
        if self._speaks(model):
            self._show(record)
            if self.summary is not None:
                self.summary.write(record)
        self._last = self.clock()  # the telemetry's own time is not the next step's
        return record

    def _show(self, record: StepRecord) -> None:
        if self.log_every is not None and (record.step + 1) % self.log_every == 0:
            if self.bar is not None:
                self.bar.clear()
            self.stream.write(record.line() + "\n")
        if self.bar is not None:
            mfu = "" if record.mfu is None else f" mfu {100 * record.mfu:.1f}%"
            self.bar.update(record.step + 1, f"loss {record.loss:.4f} {record.tokens_per_second:,.0f} tok/s{mfu}")
        self.stream.flush()

    def close(self) -> None:
        """End the progress bar and close the summary file."""
        if self.bar is not None:
            self.bar.close()
        if self.summary is not None:
            self.summary.close()

    def __enter__(self) -> "Telemetry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
