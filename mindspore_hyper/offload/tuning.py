"""Tuners for HyperOffload (docs/offload.md): prefetch depth and cache-block size, chosen by running real
training steps and measuring them."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, TextIO, Tuple

from mindspore_hyper.offload.api import WorkingSetError
from mindspore_hyper.units import format_bytes

__all__ = ["TuneResult", "tune_prefetch_depth", "tune_block_size", "ProgressBar"]

MB = 1 << 20


@dataclass
class TuneResult:
    """The best setting and every candidate's measurements (mean step seconds and store stats)."""

    best: Any
    measurements: Dict[Any, Dict[str, Any]] = field(default_factory=dict)

    def table(self) -> str:
        rows = [f"{'candidate':>12} {'step_s':>10} {'stall_ms':>10} {'hits':>6} {'misses':>6} note"]
        for cand, m in self.measurements.items():
            if "error" in m:
                rows.append(f"{cand!s:>12} {'-':>10} {'-':>10} {'-':>6} {'-':>6} {m['error']}")
            else:
                rows.append(f"{cand!s:>12} {m['step_s']:>10.4f} {m['stall_ns'] / 1e6:>10.2f} "
                            f"{m['hits']:>6} {m['misses']:>6}{'  <- best' if cand == self.best else ''}")
        return "\n".join(rows)


class ProgressBar:
    """A minimal text progress bar (stderr by default)."""

    def __init__(self, total: int, label: str, stream: Optional[TextIO] = None, width: int = 30,
                 enabled: bool = True):
        self.total, self.label, self.width, self.enabled = max(total, 1), label, width, enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self.t0 = time.perf_counter()
        self._draw("")

    def update(self, note: str = "") -> None:
        self.done += 1
        self._draw(note)
        if self.done >= self.total and self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, note: str) -> None:
        if not self.enabled:
            return
        filled = int(self.width * self.done / self.total)
        elapsed = time.perf_counter() - self.t0
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                          f"{self.done}/{self.total} {elapsed:6.1f}s {note}")
        self.stream.flush()


def _measure(run_step: Callable[[], Any], store, steps: int, warmup: int,
             bar: ProgressBar, label: str) -> Dict[str, Any]:
    for _ in range(warmup):
        run_step()
        bar.update(f"{label} warm-up")
    store.scheduler.drain()
    store.scheduler.reset_stats()
    before = store.blocks.stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        run_step()
        bar.update(label)
    elapsed = time.perf_counter() - t0
    after = store.blocks.stats()
    pf = store.scheduler.stats()
    moved = {k: after["bytes_moved"][k] - before["bytes_moved"][k] for k in after["bytes_moved"]}
    return {"step_s": elapsed / steps, "stall_ns": pf["stall_ns"], "hits": pf["hits"],
            "late": pf["late"], "misses": pf["misses"], "issued": pf["issued"], "bytes_moved": moved,
            "device_peak_bytes": after["device"]["peak_bytes"]}


def tune_prefetch_depth(run_step: Callable[[], Any], store, candidates: Sequence[int] = (2, 4, 8, 16),
                        steps: int = 3, warmup: int = 1, progress: bool = True,
                        stream: Optional[TextIO] = None) -> TuneResult:
    """Runs `steps` real training steps at each prefetch depth and returns the fastest.

    Args:
        run_step: runs one training step (e.g. ``lambda: step(x, y)`` of an OffloadedModel).
        store: the `OffloadStore` the model uses (``offloaded.store``).
        candidates: prefetch depths in blocks.
        steps, warmup: measured and unmeasured steps per candidate.

    Returns:
        TuneResult(best=depth, measurements={depth: {...}}); the store is left at the best depth.
    """
    bar = ProgressBar(len(candidates) * (steps + warmup), "tune prefetch_depth", stream, enabled=progress)
    result = TuneResult(best=None)
    for depth in candidates:
        store.prefetch_depth = depth
        result.measurements[depth] = _measure(run_step, store, steps, warmup, bar, f"depth={depth}")
    result.best = min(result.measurements, key=lambda d: result.measurements[d]["step_s"])
    store.prefetch_depth = result.best
    return result


def tune_block_size(build: Callable[[int], Tuple[Callable[[], Any], Any]],
                    candidates: Sequence[int] = (32 * MB, 64 * MB, 128 * MB, 256 * MB),
                    steps: int = 3, warmup: int = 1, progress: bool = True,
                    stream: Optional[TextIO] = None) -> TuneResult:
    """Builds the offloaded model at each cache-block size, runs real steps, returns the fastest.

    Args:
        build: ``block_size -> (run_step, store)``; called once per candidate (a candidate whose
            working set does not fit the device tier raises WorkingSetError and is skipped).
        candidates: block sizes in bytes (64-128 MiB suit a real device; small values for tests).

    Returns:
        TuneResult(best=block_size, measurements={block_size: {...}}).
    """
    bar = ProgressBar(len(candidates) * (steps + warmup), "tune cache_block_size", stream, enabled=progress)
    result = TuneResult(best=None)
    for bs in candidates:
        try:
            run_step, store = build(bs)
        except WorkingSetError as exc:
            result.measurements[bs] = {"error": str(exc)}
            for _ in range(steps + warmup):
                bar.update(f"block={format_bytes(bs, short=True)} skipped")
            continue
        label = f"block={format_bytes(bs, short=True)}"
        result.measurements[bs] = _measure(run_step, store, steps, warmup, bar, label)
        store.close()
    feasible = [b for b, m in result.measurements.items() if "error" not in m]
    if not feasible:
        raise WorkingSetError("no block-size candidate fits the device tier: " +
                              "; ".join(m["error"] for m in result.measurements.values()))
    result.best = min(feasible, key=lambda b: result.measurements[b]["step_s"])
    return result
