"""Published step-time measurements the step-time model is checked against (docs/estimate.md).

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198): Table 3's configurations (GPT, sequence 2048, vocabulary 51200, tensor
parallel 8, pipeline parallel as listed, no data parallelism; global batch 4, 64, 280 and 512
sequences of micro-batch 1) and Table 5's seconds per iteration on Selene (DGX A100 80GB) for "full recompute" (tensor
parallelism with every layer recomputed) and "present work" (sequence parallelism + selective
recomputation). The micro-batch size (1) is our reading of the paper's setup (MFU in its Table 5
agrees with it: 175B, 64 sequences, 13.75 s -> 51.4% of 64 x 312 TFLOP/s; 22B, 4 sequences on 8
GPUs, 1.10 s -> 41.6%, the paper's 41.5%). The software is Megatron-LM of 2022 (the paper's
code, NVIDIA/Megatron-LM with sequence parallelism, merged March 2022): stage-to-stage transfers
block (`p2p_communication._communicate`: batch_isend_irecv, wait, torch.cuda.synchronize), and
each column-parallel linear's backward runs its input gradient's all-reduce (reduce-scatter with
sequence parallelism) beside its weight-gradient GEMM (`LinearWithGradAccumulationAndAsyncCommunication`,
`async_tensor_model_parallel_allreduce` on by default since September 2021): the strategies say so
(`p2p_overlap=False`, `tp_backward_overlap=True`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

from mindspore_hyper._resources import resource_path
from mindspore_hyper.estimate.hardware import Hardware, load_hardware
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.estimate.step_time import StepTimeEstimate, estimate_step_time, global_batch
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["PublishedRun", "ValidationRow", "KORTHIKANTI_TABLE5", "table5_rows", "format_rows",
           "HeldoutRun", "HeldoutRow", "HELDOUT_FILE", "FLOP_CONVENTIONS", "METRICS", "METRIC_UNITS",
           "load_heldout", "predict_heldout", "heldout_rows", "heldout_summary", "format_heldout", "step_flops"]


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
        """The run's strategy: mode "full" (TP, full recompute) or "selective" (TP + SP + selective),
        as the 2022 Megatron-LM ran it (module doc): blocking stage-to-stage transfers, and the
        backward's tensor-parallel collectives overlapped with the weight-gradient GEMMs."""
        software = {"p2p_overlap": False, "tp_backward_overlap": True}
        if mode == "full":
            return JobStrategy(tensor=8, pipeline=self.pipeline, microbatches=self.batch, recompute="full", **software)
        return JobStrategy(tensor=8, pipeline=self.pipeline, microbatches=self.batch, recompute="selective",
                           sequence_parallel=True, **software)


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


# --- held-out validation (issue 39): published runs the factors were never fitted to -------------------

HELDOUT_FILE = "heldout_step_time.yaml"
FLOP_CONVENTIONS = ("narayanan2021", "model")
# The published figure compared: teraFLOP/s per GPU (counted by the row's `flops` convention), tokens per
# second per GPU, or GPU-hours per trillion tokens (a cost: lower is faster).
METRICS = ("tflops_per_gpu", "tokens_per_gpu_s", "gpu_hours_per_trillion_tokens")
METRIC_UNITS = {"tflops_per_gpu": "TFLOP/s", "tokens_per_gpu_s": "tokens/s/GPU",
                "gpu_hours_per_trillion_tokens": "GPU-h/T tokens"}
_ROW_KEYS = ("id", "source", "reference", "hardware", "model", "strategy", "gpus", "global_batch", "flops", "metric",
             "published", "assumptions", "nearest")
_ROW_REQUIRED = ("id", "source", "reference", "hardware", "model", "strategy", "gpus", "global_batch", "flops",
                 "metric", "published")


@dataclass(frozen=True)
class HeldoutRun:
    """One published training run of configs/validation/heldout_step_time.yaml.

    Attributes:
        id: "source/name".
        source: key of the file's `sources:` (the citation).
        reference: the table and row the figures come from.
        hardware: the preset it is predicted on.
        config, strategy: the run's model and parallel strategy.
        gpus: devices of the run (= strategy.devices).
        global_batch: sequences per step (= micro-batches x micro-batch x data).
        flops: how the publication counts FLOPs (FLOP_CONVENTIONS).
        metric: the published figure compared (METRICS).
        published: every published figure of the row (metric -> value).
        assumptions: what the publication does not give and was chosen.
        nearest: what the run does that the estimator cannot represent (FP8 GEMMs, MLA, ...): the row
            is then predicted with the nearest representable configuration, reported apart from the
            representable rows and profiled by term, never fitted ("" = representable).
    """

    id: str
    source: str
    reference: str
    hardware: str
    config: TransformerConfig
    strategy: JobStrategy
    gpus: int
    global_batch: int
    flops: str
    metric: str
    published: Dict[str, float] = field(default_factory=dict)
    assumptions: str = ""
    nearest: str = ""


@dataclass(frozen=True)
class HeldoutRow:
    """A held-out run predicted: the estimate and the metric it gives beside the published one."""

    run: HeldoutRun
    estimate: StepTimeEstimate
    predicted: float
    published: float

    @property
    def error(self) -> float:
        """Predicted speed / published speed - 1 (positive = predicted faster than measured):
        predicted / published - 1 for a rate (TFLOP/s, tokens/s), published / predicted - 1 for a cost
        (GPU-hours per trillion tokens)."""
        if self.run.metric == "gpu_hours_per_trillion_tokens":
            return self.published / self.predicted - 1.0
        return self.predicted / self.published - 1.0


def step_flops(config: TransformerConfig, batch: int, convention: str) -> float:
    """FLOPs of one step of `batch` sequences as the publication counts them (FLOP_CONVENTIONS)."""
    if convention == "narayanan2021":  # eq. (3): with the recomputed forward of full recomputation
        s, l, h, v = config.seq_len, config.layers, config.hidden, config.vocab
        return 96.0 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    if convention == "model":
        from mindspore_hyper.estimate.layer_ops import model_flops_per_token

        return model_flops_per_token(config) * batch * config.seq_len
    raise ValueError(f"flops={convention!r}: expected one of {', '.join(FLOP_CONVENTIONS)}")


def _row_error(path: str, i: int, row: Any, message: str) -> ValueError:
    name = row.get("id") if isinstance(row, dict) else None
    return ValueError(f"held-out file {path!r}: row {i}{f' ({name})' if name else ''}: {message}")


def _parse_row(path: str, i: int, row: Any, sources: Dict[str, str]) -> HeldoutRun:
    if not isinstance(row, dict):
        raise _row_error(path, i, row, f"expected a mapping, got {row!r}")
    for key in row:
        if key not in _ROW_KEYS:
            raise _row_error(path, i, row, f"field {key!r}: unknown; expected one of {', '.join(_ROW_KEYS)}")
    for key in _ROW_REQUIRED:
        if key not in row:
            raise _row_error(path, i, row, f"field {key!r}: missing")
    for key in ("id", "source", "reference", "hardware", "flops", "metric"):
        if not isinstance(row[key], str) or not row[key]:
            raise _row_error(path, i, row, f"field {key!r}: expected a non-empty string, got {row[key]!r}")
    if row["source"] not in sources:
        raise _row_error(path, i, row, f"field 'source': {row['source']!r} is not in the file's sources "
                                       f"({', '.join(sources)})")
    if row["flops"] not in FLOP_CONVENTIONS:
        raise _row_error(path, i, row, f"field 'flops': expected one of {', '.join(FLOP_CONVENTIONS)}, "
                                       f"got {row['flops']!r}")
    if row["metric"] not in METRICS:
        raise _row_error(path, i, row, f"field 'metric': expected one of {', '.join(METRICS)}, got {row['metric']!r}")
    published = row["published"]
    if not isinstance(published, dict) or not all(not isinstance(v, bool) and isinstance(v, (int, float)) and v > 0
                                                  for v in published.values()):
        raise _row_error(path, i, row, f"field 'published': expected a mapping of figure -> positive number, "
                                       f"got {published!r}")
    if row["metric"] not in published:
        raise _row_error(path, i, row, f"field 'published': has no {row['metric']!r} (the row's metric)")
    for key in ("model", "strategy"):
        if not isinstance(row[key], dict):
            raise _row_error(path, i, row, f"field {key!r}: expected a mapping, got {row[key]!r}")
    try:
        config = TransformerConfig(**row["model"])
    except (TypeError, ValueError) as exc:
        raise _row_error(path, i, row, f"field 'model': {exc}") from None
    try:
        strategy = JobStrategy(**row["strategy"])
    except (TypeError, ValueError) as exc:
        raise _row_error(path, i, row, f"field 'strategy': {exc}") from None
    for key in ("gpus", "global_batch"):
        if isinstance(row[key], bool) or not isinstance(row[key], int) or row[key] < 1:
            raise _row_error(path, i, row, f"field {key!r}: expected an int >= 1, got {row[key]!r}")
    if row["gpus"] != strategy.devices:
        raise _row_error(path, i, row, f"field 'gpus': {row['gpus']}, but the strategy has {strategy.devices} "
                                       f"devices (data x tensor x pipeline x context)")
    if row["global_batch"] != global_batch(config, strategy):
        raise _row_error(path, i, row, f"field 'global_batch': {row['global_batch']}, but micro-batches x "
                                       f"micro_batch x data = {global_batch(config, strategy)}")
    try:
        load_hardware(row["hardware"])
    except ValueError as exc:
        raise _row_error(path, i, row, f"field 'hardware': {exc}") from None
    texts = {}
    for key in ("assumptions", "nearest"):
        texts[key] = row.get(key, "")
        if not isinstance(texts[key], str):
            raise _row_error(path, i, row, f"field {key!r}: expected a string, got {texts[key]!r}")
    return HeldoutRun(row["id"], row["source"], row["reference"], row["hardware"], config, strategy, row["gpus"],
                      row["global_batch"], row["flops"], row["metric"],
                      {k: float(v) for k, v in published.items()}, texts["assumptions"].strip(),
                      " ".join(texts["nearest"].split()))


def load_heldout(path: Optional[str] = None) -> Tuple[Dict[str, str], List[HeldoutRun]]:
    """The sources (key -> citation) and runs of a held-out file (default: the shipped
    configs/validation/heldout_step_time.yaml).

    Raises:
        ValueError: an unreadable file or a malformed row (the message names the file, the row and the field).
    """
    import yaml

    path = path or os.path.join(resource_path("validation"), HELDOUT_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ValueError(f"held-out file {path!r}: cannot read ({exc})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"held-out file {path!r}: invalid YAML ({exc})") from None
    if not isinstance(data, dict) or set(data) != {"sources", "rows"}:
        raise ValueError(f"held-out file {path!r}: expected a mapping with exactly 'sources' and 'rows'")
    sources = data["sources"]
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise ValueError(f"held-out file {path!r}: field 'sources': expected a mapping of key -> citation text")
    rows = data["rows"]
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"held-out file {path!r}: field 'rows': expected a non-empty list")
    runs = [_parse_row(path, i, row, sources) for i, row in enumerate(rows)]
    seen = set()
    for i, run in enumerate(runs):
        if run.id in seen:
            raise ValueError(f"held-out file {path!r}: row {i} ({run.id}): field 'id': repeated")
        seen.add(run.id)
    return {k: " ".join(v.split()) for k, v in sources.items()}, runs


def predict_heldout(run: HeldoutRun, hardware: Union[str, Hardware, None] = None) -> HeldoutRow:
    """`run` predicted by `estimate_step_time` on its preset (or `hardware`), as its published metric."""
    est = estimate_step_time(run.config, run.strategy, hardware if hardware is not None else run.hardware)
    tokens = run.global_batch * run.config.seq_len  # per step
    if run.metric == "tflops_per_gpu":
        predicted = step_flops(run.config, run.global_batch, run.flops) / (est.seconds * run.gpus) / 1e12
    elif run.metric == "tokens_per_gpu_s":
        predicted = tokens / (est.seconds * run.gpus)
    elif run.metric == "gpu_hours_per_trillion_tokens":
        predicted = est.seconds * run.gpus / 3600.0 * 1e12 / tokens
    else:  # pragma: no cover - METRICS is checked by the loader
        raise ValueError(f"metric={run.metric!r}: expected one of {', '.join(METRICS)}")
    return HeldoutRow(run, est, predicted, run.published[run.metric])


def heldout_rows(path: Optional[str] = None) -> List[HeldoutRow]:
    """Every run of the held-out file predicted with the shipped presets and factors (no refitting)."""
    return [predict_heldout(run) for run in load_heldout(path)[1]]


def heldout_summary(rows: List[HeldoutRow]) -> Dict[str, Any]:
    """Mean |error| and worst row: over all rows, over the representable rows (when some are
    predicted with a nearest configuration), and per source; and how many rows are within 10%."""
    def one(group: List[HeldoutRow]) -> Dict[str, Any]:
        worst = max(group, key=lambda r: abs(r.error))
        return {"rows": len(group), "mae": sum(abs(r.error) for r in group) / len(group),
                "worst": worst.run.id, "worst_error": worst.error,
                "within_10": sum(abs(r.error) <= 0.10 for r in group)}

    summary = {"all": one(rows)}
    representable = [r for r in rows if not r.run.nearest]
    if representable and len(representable) < len(rows):
        summary["representable"] = one(representable)
    for source in dict.fromkeys(r.run.source for r in rows):
        summary[source] = one([r for r in rows if r.run.source == source])
    return summary


def format_heldout(rows: List[HeldoutRow]) -> str:
    """A Markdown table of the held-out rows (predicted vs published), with the mean absolute error."""
    lines = ["| run | source row | hardware | t x p x d (x cp), v (, ep) | published | predicted | error | "
             "predicted MFU | bubble | exposed comm |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st, est = r.run.strategy, r.estimate
        sizes = f"{st.tensor} x {st.pipeline} x {st.data}" + (f" x {st.context_parallel}" if st.context_parallel > 1
                                                              else "") + f", {st.chunks}"
        sizes += f", ep {st.expert}" if st.expert > 1 else ""
        b, unit = est.breakdown, METRIC_UNITS[r.run.metric]
        name = r.run.id + (" (nearest)" if r.run.nearest else "")
        lines.append(f"| {name} | {r.run.reference.split(':')[0]} | {est.hardware} | {sizes} | "
                     f"{r.published:g} {unit} | {r.predicted:.1f} {unit} | {r.error:+.1%} | {est.mfu:.1%} | "
                     f"{b['pipeline bubble'] / est.seconds:.1%} | {b['exposed communication'] / est.seconds:.1%} |")
    lines.append("")
    for key, s in heldout_summary(rows).items():
        label = {"all": "all rows", "representable": "representable rows (without the nearest-configuration ones)"}.get(
            key, key)
        lines.append(f"{label}: {s['rows']} rows, mean |error| {s['mae']:.1%}, worst {s['worst']} "
                     f"{s['worst_error']:+.1%}, {s['within_10']} of {s['rows']} within 10%")
    return "\n".join(lines)
