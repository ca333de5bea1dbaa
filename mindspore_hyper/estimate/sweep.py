"""Sequence sweep: the job estimate at growing sequence lengths (4K -> 128K), and its plot."""
from __future__ import annotations

from typing import List, Optional, Sequence

from mindspore_hyper.estimate.job import DEVICE_KINDS, JobEstimate, estimate_job
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["sequence_sweep", "plot_sweep", "DEFAULT_SEQ_LENS"]

DEFAULT_SEQ_LENS = tuple(4096 << i for i in range(6))  # 4K, 8K, ..., 128K


def sequence_sweep(config: TransformerConfig, strategy: JobStrategy, seq_lens: Sequence[int] = DEFAULT_SEQ_LENS,
                   device_memory: Optional[int] = None) -> List[JobEstimate]:
    """The job estimate at each sequence length (everything else kept).

    Raises:
        ValueError: an empty or non-increasing list of lengths, or a length the strategy refuses.
    """
    lengths = list(seq_lens)
    if not lengths or any(b <= a for a, b in zip(lengths, lengths[1:])):
        raise ValueError(f"seq_lens={lengths!r}: expected increasing sequence lengths")
    return [estimate_job(config.with_(seq_len=s), strategy, device_memory) for s in lengths]


def plot_sweep(estimates: Sequence[JobEstimate], path: str, title: Optional[str] = None) -> str:
    """Save a PNG: the peak stage's device memory per kind (stacked) against sequence length.

    Args:
        estimates: from `sequence_sweep`.
        path: the PNG file to write.
        title: plot title (default: a summary of model and strategy).

    Returns:
        `path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not estimates:
        raise ValueError("plot_sweep: no estimates to plot")
    lengths = [e.config.seq_len for e in estimates]
    gib = float(2**30)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    series = [[getattr(e.peak, kind) / gib for e in estimates] for kind in DEVICE_KINDS]
    ax.stackplot(lengths, *series, labels=[k.replace("_", " ") for k in DEVICE_KINDS], alpha=0.85)
    budget = estimates[0].device_memory
    if budget is not None:
        ax.axhline(budget / gib, color="red", linestyle="--", label=f"device memory {budget / gib:.0f} GiB")
    for x, e in zip(lengths, estimates):
        ax.annotate(f"{e.peak.total / gib:.1f}", (x, e.peak.total / gib), textcoords="offset points",
                    xytext=(0, 4), ha="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([f"{s // 1024}K" if s % 1024 == 0 else str(s) for s in lengths])
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("GiB per device (peak stage)")
    c, st = estimates[0].config, estimates[0].strategy
    ax.set_title(title or f"{c.layers}L h{c.hidden} b{c.micro_batch}, d{st.data} t{st.tensor} p{st.pipeline}"
                          f"{' SP' if st.sequence_parallel else ''} ZeRO-{st.zero_stage}, "
                          f"{'inference' if st.inference else 'recompute ' + st.recompute}")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
