"""Published step-time measurements the step-time model is checked against (docs/estimate.md).

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198): Table 3's configurations (GPT, sequence 2048, vocabulary 51200, tensor
parallel 8, pipeline parallel as listed, no data parallelism; global batch 4, 64, 280 and 512
sequences of micro-batch 1) and Table 5's seconds per iteration on Selene (DGX A100 80GB) for "full recompute" (tensor
parallelism with every layer recomputed) and "present work" (sequence parallelism + selective
recomputation). The micro-batch size (1) is our reading of the paper's setup (MFU in its Table 5
agrees with it: 175B, 64 sequences, 13.75 s -> 51.4% of 64 x 312 TFLOP/s; 22B, 4 sequences on 8
GPUs, 1.10 s -> 41.6%, the paper's 41.5%).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple, Union

from mindspore_hyper.estimate.hardware import Hardware
from mindspore_hyper.estimate.model import TransformerConfig
from mindspore_hyper.estimate.step_time import estimate_step_time
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["PublishedRun", "ValidationRow", "KORTHIKANTI_TABLE5", "table5_rows", "format_rows"]


@dataclass(frozen=True)
class PublishedRun:
    """One model of Korthikanti et al. Table 3 with its Table 5 seconds per iteration."""

    name: str
    config: TransformerConfig
    pipeline: int
    gpus: int
    batch: int
    full_s: float
    selective_s: float

    def strategy(self, mode: str) -> JobStrategy:
        """The run's strategy: mode "full" (TP, full recompute) or "selective" (TP + SP + selective)."""
        if mode == "full":
            return JobStrategy(tensor=8, pipeline=self.pipeline, microbatches=self.batch, recompute="full")
        return JobStrategy(tensor=8, pipeline=self.pipeline, microbatches=self.batch, recompute="selective",
                           sequence_parallel=True)


def _gpt(layers: int, hidden: int, heads: int) -> TransformerConfig:
    return TransformerConfig(layers=layers, hidden=hidden, heads=heads, vocab=51200, seq_len=2048, micro_batch=1)


KORTHIKANTI_TABLE5: Tuple[PublishedRun, ...] = (
    PublishedRun("22B", _gpt(48, 6144, 64), 1, 8, 4, 1.42, 1.10),
    PublishedRun("175B", _gpt(96, 12288, 96), 8, 64, 64, 18.13, 13.75),
    PublishedRun("530B", _gpt(105, 20480, 128), 35, 280, 280, 49.05, 37.83),
    PublishedRun("1T", _gpt(128, 25600, 160), 64, 512, 512, 94.42, 71.49),
)


@dataclass(frozen=True)
class ValidationRow:
    """Predicted vs measured seconds of one published run."""

    model: str
    mode: str
    measured: float
    predicted: float
    mfu: float
    bubble_source: str

    @property
    def name(self) -> str:
        return f"{self.model} {self.mode}"

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return self.predicted / self.measured - 1.0


def table5_rows(hardware: Union[str, Hardware] = "a100-80gb") -> List[ValidationRow]:
    """The 8 rows of Table 5 predicted on `hardware` (default the a100-80gb preset)."""
    rows = []
    for run in KORTHIKANTI_TABLE5:
        for mode, measured in (("full", run.full_s), ("selective", run.selective_s)):
            est = estimate_step_time(run.config, run.strategy(mode), hardware)
            rows.append(ValidationRow(run.name, mode, measured, est.seconds, est.mfu, est.pipeline.source))
    return rows


def format_rows(rows: List[ValidationRow]) -> str:
    """A Markdown table of the rows, with the mean absolute error."""
    lines = ["| model | recompute | measured s | predicted s | error | predicted MFU | bubble from |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        mode = "full" if r.mode == "full" else "SP + selective"
        lines.append(f"| {r.model} | {mode} | {r.measured:.2f} | {r.predicted:.2f} | {r.error:+.1%} | {r.mfu:.1%} | "
                     f"{r.bubble_source} |")
    mean = sum(abs(r.error) for r in rows) / len(rows)
    worst = max(rows, key=lambda r: abs(r.error))
    lines.append(f"\nmean |error| {mean:.1%}; worst {worst.name} {worst.error:+.1%}")
    return "\n".join(lines)
