"""Strategy search: enumerate parallel layouts for a model on N devices, keep those that fit, rank
them by predicted step time (`estimate_step_time`).

Enumerated: tensor t (divisors of N up to the hardware's innermost domain, dividing the heads),
context parallel cp, pipeline p (<= layers), data d = N / (t cp p) (dividing the global batch),
expert parallel (MoE: divisors of d dividing the experts), micro-batch size (the micro-batches
per step follow from the global batch), schedule (1f1b, interleaved_1f1b with 2 chunks, zb_h1,
zb_v, dualpipe_v where the builders accept p and m), ZeRO stage, recomputation.

Two dominance rules keep it fast (both hold in the model, the tests check them on a small
grid against exhaustive enumeration): with t > 1 sequence parallelism is always on (the same
bytes move as the all-reduces it replaces, norms and dropouts run on 1/t of the tokens, less
memory); per layout and ZeRO stage only the least recomputation that fits is timed (more
recomputation only adds time). `fitting_candidates` times every fitting candidate with the
published bubble formulas; `search_strategies` then times the best `top x refine` again with the
schedule simulator (`refine_candidates`).

Memory is the estimator's (`estimate_stage` of the first and the last pipeline stage: the first
holds the most in-flight micro-batches, the last the head and logits) against `memory_fraction`
of the device (the rest for the framework, workspace and fragmentation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple, Union

from mindspore_hyper.estimate.activations import RECOMPUTE_MODES
from mindspore_hyper.estimate.hardware import Hardware, load_hardware
from mindspore_hyper.estimate.job import StageEstimate, estimate_stage
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.estimate.step_time import StepTimeEstimate, estimate_step_time
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["SearchResult", "search_strategies", "fitting_candidates", "refine_candidates", "SEARCH_SCHEDULES",
           "plot_front"]

SEARCH_SCHEDULES = ("1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe_v")
_CHUNKS = {"1f1b": 1, "interleaved_1f1b": 2, "zb_h1": 1, "zb_v": 2, "dualpipe_v": 2}


@dataclass
class SearchResult:
    """One fitting strategy and its predictions.

    Attributes:
        strategy: the JobStrategy.
        config: the model with the searched micro-batch size.
        estimate: the `estimate_step_time` result.
        memory: the fullest pipeline stage's memory estimate (bytes per device).
    """

    strategy: JobStrategy
    config: TransformerConfig
    estimate: StepTimeEstimate
    memory: StageEstimate

    @property
    def seconds(self) -> float:
        return self.estimate.seconds

    def describe(self) -> str:
        """One line: sizes, schedule, ZeRO, recompute, micro-batch."""
        st = self.strategy
        parts = [f"d{st.data}", f"t{st.tensor}", f"p{st.pipeline}"]
        if st.context_parallel > 1:
            parts.append(f"cp{st.context_parallel}")
        if st.expert > 1:
            parts.append(f"ep{st.expert}")
        text = " ".join(parts)
        text += f" {st.schedule}" if st.pipeline > 1 else ""
        text += f"{' SP' if st.sequence_parallel else ''} ZeRO-{st.zero_stage} recompute {st.recompute}"
        return text + f" mb{self.config.micro_batch} x {st.step_microbatches}"


def _divisors(n: int) -> List[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _schedules(p: int, m: int, layers: int, schedules: Sequence[str]) -> List[Tuple[str, int]]:
    if p == 1:
        return [("1f1b", 1)]
    out = []
    for kind in schedules:
        v = _CHUNKS[kind]
        if layers < p * v or m < p:
            continue
        if kind == "interleaved_1f1b" and m % p:
            continue
        if kind == "dualpipe_v" and m < 2 * p:
            continue
        out.append((kind, v))
    return out


def _peak(config: TransformerConfig, strategy: JobStrategy) -> StageEstimate:
    stages = {0, strategy.pipeline - 1}
    return max((estimate_stage(config, strategy, k) for k in stages), key=lambda s: s.total)


def search_strategies(config: TransformerConfig, devices: int, hardware: Union[str, Hardware, dict],
                      global_batch: int, *, top: int = 10, refine: int = 3, **options) -> List[SearchResult]:
    """The fastest fitting strategies for `config` on `devices` devices, best first.

    Args:
        config: the model (its micro_batch is replaced by the searched sizes).
        devices: devices of the job (every strategy uses all of them).
        hardware: a preset name, YAML path, mapping or Hardware.
        global_batch: sequences per step.
        top: results returned.
        refine: the best top x refine of the formula-timed candidates are timed again with the
            schedule simulator.
        **options: what to enumerate, the memory share and a progress callback, as
            `fitting_candidates` takes them.

    Returns:
        Up to `top` SearchResults, fastest first (empty when nothing fits).

    Raises:
        ValueError: a bad argument (named), or more devices than the hardware has.
    """
    candidates = fitting_candidates(config, devices, hardware, global_batch, **options)
    return refine_candidates(candidates, hardware, top, refine)


def refine_candidates(candidates: Sequence[SearchResult], hardware: Union[str, Hardware, dict], top: int = 10,
                      refine: int = 3) -> List[SearchResult]:
    """Re-time the best top x refine formula-timed candidates with the schedule simulator; the
    fastest `top`, best first."""
    for name, value in (("top", top), ("refine", refine)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: expected an int >= 1")
    hw = load_hardware(hardware)
    results = [SearchResult(r.strategy, r.config, estimate_step_time(r.config, r.strategy, hw), r.memory)
               for r in candidates[:top * refine]]
    results.sort(key=lambda r: r.seconds)
    return results[:top]


def fitting_candidates(config: TransformerConfig, devices: int, hardware: Union[str, Hardware, dict],
                       global_batch: int, *, tensor: Optional[Sequence[int]] = None,
                       pipeline: Optional[Sequence[int]] = None, context: Optional[Sequence[int]] = None,
                       expert: Optional[Sequence[int]] = None, micro_batches: Sequence[int] = (1, 2, 4, 8),
                       schedules: Sequence[str] = SEARCH_SCHEDULES, zero_stages: Sequence[int] = (0, 1, 2, 3),
                       recompute: Sequence[str] = RECOMPUTE_MODES, memory_fraction: float = 0.9,
                       progress: Optional[Callable[[int, int], None]] = None) -> List[SearchResult]:
    """Every enumerated strategy that fits, with the least fitting recomputation per layout and
    ZeRO stage, timed with the published bubble formulas (`simulation_limit=0`), fastest first.

    Args:
        config: the model (its micro_batch is replaced by the searched sizes).
        devices: devices of the job (every strategy uses all of them).
        hardware: a preset name, YAML path, mapping or Hardware.
        global_batch: sequences per step.
        tensor, pipeline, context, expert: sizes to try (default: every valid divisor; context:
            1, and 2-16 for sequences of 16K tokens or more).
        micro_batches: micro-batch sizes to try.
        schedules: pipeline schedules to try (SEARCH_SCHEDULES).
        zero_stages, recompute: ZeRO stages and recomputation modes to try.
        memory_fraction: share of the device memory a strategy may use.
        progress: called as progress(done, total) while candidates are examined.

    Returns:
        SearchResults (their estimates' bubbles from the formulas), fastest first.

    Raises:
        ValueError: a bad argument (named), or more devices than the hardware has.
    """
    hw = load_hardware(hardware)
    for name, value in (("devices", devices), ("global_batch", global_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: expected an int >= 1")
    if devices > hw.max_devices:
        raise ValueError(f"devices={devices}: hardware {hw.name!r} has {hw.max_devices}")
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction={memory_fraction!r}: expected a number in (0, 1]")
    unknown = [s for s in schedules if s not in SEARCH_SCHEDULES]
    if unknown:
        raise ValueError(f"schedules: {unknown[0]!r} unknown; expected some of {', '.join(SEARCH_SCHEDULES)}")
    budget = int(hw.memory_bytes * memory_fraction)
    ts = [t for t in (tensor or _divisors(devices)) if devices % t == 0 and t <= hw.levels[0].devices
          and config.heads % t == 0]
    if context is None:
        context = [1] + ([c for c in (2, 4, 8, 16)] if config.seq_len >= 16384 else [])
    layouts = []
    for t in ts:
        for cp in context:
            if (devices // t) % cp or config.seq_len % cp:
                continue
            for p in (pipeline or _divisors(devices // (t * cp))):
                if (devices // (t * cp)) % p or p > config.layers:
                    continue
                d = devices // (t * cp * p)
                if global_batch % d:
                    continue
                for ep in (expert or (_divisors(d) if config.experts else [1])):
                    if d % ep or (ep > 1 and (not config.experts or config.experts % ep)):
                        continue
                    for mb in micro_batches:
                        per_replica = global_batch // d
                        if per_replica % mb:
                            continue
                        for kind, v in _schedules(p, per_replica // mb, config.layers, schedules):
                            layouts.append((t, cp, p, d, ep, mb, per_replica // mb, kind, v))
    order = [r for r in RECOMPUTE_MODES if r in recompute]
    quick: List[SearchResult] = []
    for done, (t, cp, p, d, ep, mb, m, kind, v) in enumerate(layouts, 1):
        if progress is not None:
            progress(done, len(layouts))
        cfg = config.with_(micro_batch=mb)
        for zero in zero_stages:
            for mode in order:
                try:
                    st = JobStrategy(data=d, tensor=t, pipeline=p, expert=ep, sequence_parallel=t > 1,
                                     zero_stage=zero, recompute=mode, microbatches=m, context_parallel=cp,
                                     schedule=kind, chunks=v)
                    peak = _peak(cfg, st)
                except ValueError:
                    break  # this layout is refused by the estimator (divisibility): no mode helps
                if peak.total <= budget:
                    try:
                        quick.append(SearchResult(st, cfg, estimate_step_time(cfg, st, hw, simulation_limit=0), peak))
                    except ValueError:
                        pass
                    break
    quick.sort(key=lambda r: r.seconds)
    return quick


def plot_front(results: Sequence[SearchResult], path: str, title: Optional[str] = None) -> str:
    """Save a PNG of step time against peak memory per device for `results` (e.g. every
    `fitting_candidates` result), the Pareto front (no other result both faster and smaller)
    joined by a line and labelled.

    Returns:
        `path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("plot_front: no results to plot")
    gib = float(2 ** 30)
    points = sorted(((r.memory.total / gib, r.seconds, r) for r in results), key=lambda x: (x[0], x[1]))
    front, best = [], float("inf")
    for mem, sec, r in points:
        if sec < best:
            front.append((mem, sec, r))
            best = sec
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.scatter([x[0] for x in points], [x[1] for x in points], s=14, alpha=0.5, label="fitting strategies")
    ax.plot([x[0] for x in front], [x[1] for x in front], "r.-", label="time/memory front")
    for mem, sec, r in front:
        ax.annotate(r.describe(), (mem, sec), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title or f"{results[0].strategy.devices} devices on {results[0].estimate.hardware}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
