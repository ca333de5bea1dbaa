"""The measured PPO timeline of an msrun job: every process's units and waits, on one clock.

`PhaseEvent`s gathered from all processes (`ProcessPhases.gather`) as a table and as a PNG
Gantt chart with one row per process: what each group computed when, and where it waited.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from mindspore_hyper.rlhf.process_phases import PhaseEvent

__all__ = ["format_events", "plot_events"]


def _origin(events: Sequence[PhaseEvent]) -> float:
    return min(e.start for e in events) if events else 0.0


def format_events(events: Sequence[PhaseEvent], step: Optional[int] = None) -> str:
    """One line per unit a process ran (rank, phase, role, label, start, end in ms from the first
    event of the selection)."""
    chosen = [e for e in events if e.kind == "run" and (step is None or e.step == step)]
    t0 = _origin(chosen)
    lines = [f"{'rank':>4} {'step':>4} {'phase':<11} {'role':<13} {'unit':<16} {'start ms':>9} {'end ms':>9}"]
    for e in sorted(chosen, key=lambda e: (e.start, e.rank)):
        lines.append(f"{e.rank:>4} {e.step:>4} {e.phase:<11} {e.role:<13} {e.label:<16} {1e3 * (e.start - t0):9.1f} "
                     f"{1e3 * (e.end - t0):9.1f}")
    return "\n".join(lines)


def plot_events(events: Sequence[PhaseEvent], path: str, step: Optional[int] = None, title: Optional[str] = None
                ) -> None:
    """PNG Gantt chart: one row per process; filled bars are units run, hatched bars waits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [e for e in events if step is None or e.step == step]
    t0 = _origin([e for e in chosen if e.kind == "run"])  # a wait may have begun in the previous step
    ranks = sorted({e.rank for e in chosen})
    colors: Dict[str, str] = {"actor": "#9ecae1", "reference": "#c6dbef", "critic": "#fc9272",
                              "reward_model": "#a1d99b"}
    span = max((e.end for e in chosen), default=t0) - t0 or 1.0
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * len(ranks)))
    for e in chosen:
        row = ranks.index(e.rank)
        width = 1e3 * (e.end - e.start)
        if e.kind == "run":
            ax.barh(row, width, left=1e3 * (e.start - t0), height=0.8, color=colors.get(e.role, "#d9d9d9"),
                    edgecolor="black", linewidth=0.4)
            if width >= 1e3 * span / 25:
                ax.text(1e3 * (e.start - t0) + width / 2, row, e.label, ha="center", va="center", fontsize=7)
        else:
            start = max(e.start, t0)
            ax.barh(row, 1e3 * (e.end - start), left=1e3 * (start - t0), height=0.3, color="white", edgecolor="grey",
                    hatch="///", linewidth=0.3)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms (measured wall clock; hatched: waiting for another group's result)")
    ax.set_title(title or "PPO step under msrun")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
