"""Weak scaling: the best strategy found at each device count, with the global batch growing with
the devices, and the efficiency against the smallest count (docs/estimate.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

from mindspore_hyper.estimate.hardware import Hardware, load_hardware
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.estimate.search import SearchResult, search_strategies

__all__ = ["ScalingPoint", "weak_scaling", "plot_scaling"]


@dataclass(frozen=True)
class ScalingPoint:
    """One device count of a weak-scaling curve.

    Attributes:
        devices: devices of the job.
        global_batch: sequences per step (per_device_batch x devices).
        best: the fastest fitting strategy found (None when nothing fits).
        efficiency: tokens/s per device over the first point's (1.0 at the first point).
    """

    devices: int
    global_batch: int
    best: Optional[SearchResult]
    efficiency: Optional[float]


def weak_scaling(config: TransformerConfig, sizes: Sequence[int], hardware: Union[str, Hardware, dict],
                 per_device_batch: int = 1, **search_options) -> List[ScalingPoint]:
    """Search the best strategy at each size with global batch = per_device_batch x devices.

    Args:
        config: the model.
        sizes: increasing device counts.
        hardware: preset name, YAML path, mapping or Hardware.
        per_device_batch: sequences per device per step.
        **search_options: passed to `search_strategies` (micro_batches, schedules, ...).

    Returns:
        One ScalingPoint per size; efficiency relative to the first size that fits.

    Raises:
        ValueError: sizes not increasing, or a bad search argument.
    """
    sizes = list(sizes)
    if not sizes or any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"sizes={sizes!r}: expected increasing device counts")
    hw = load_hardware(hardware)
    points: List[ScalingPoint] = []
    base: Optional[float] = None
    for n in sizes:
        found = search_strategies(config, n, hw, per_device_batch * n, top=1, **search_options)
        best = found[0] if found else None
        per_device = best.estimate.tokens_per_second / n if best else None
        if base is None and per_device is not None:
            base = per_device
        points.append(ScalingPoint(n, per_device_batch * n, best,
                                   per_device / base if per_device is not None and base else None))
    return points


def plot_scaling(points: Sequence[ScalingPoint], path: str, title: str = "", claim: Optional[float] = None) -> str:
    """Save a PNG of weak-scaling efficiency against devices (and a claimed efficiency as a line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p.devices for p in points if p.efficiency is not None]
    ys = [100 * p.efficiency for p in points if p.efficiency is not None]
    if not xs:
        raise ValueError("plot_scaling: no point fits")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(xs, ys, "o-", label="predicted (best strategy per size)")
    for p in points:
        if p.best is not None:
            ax.annotate(p.best.describe().split(" ZeRO")[0], (p.devices, 100 * p.efficiency), fontsize=6,
                        xytext=(2, -10), textcoords="offset points")
    if claim is not None:
        ax.axhline(100 * claim, color="red", linestyle="--", label=f"claimed {claim:.0%}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("devices")
    ax.set_ylabel(f"weak-scaling efficiency vs {xs[0]} devices (%)")
    ax.set_ylim(min(ys + [100 * claim if claim else 100]) - 5, max(ys + [100]) + 3)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
