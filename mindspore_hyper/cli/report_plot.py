"""The plot of a run's report (`mindspore-hyper run/dryrun --plot PNG`): per-device memory over
the step, one line per distinct device program (a mesh's representative devices, and each set of
devices with a program of its own, e.g. the expert members under a routing histogram): after a
training step its activations and gradients over forward, backward and update (`step_memory`),
else the live bytes as each forward op starts; and the bytes one device sends per mesh axis and
phase."""
from __future__ import annotations

from typing import Dict

__all__ = ["plot_report", "add_plot_argument"]


def add_plot_argument(parser, where: str = "") -> None:
    """The `--plot PNG` flag of `run` and `dryrun`."""
    parser.add_argument("--plot", metavar="PNG",
                        help=f"plot memory over the step and communication per axis{where}")


def plot_report(report: Dict, path: str) -> str:
    """Write the PNG of `report` (the `--json` schema) to `path`; returns `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    labels, sent = [], []
    for mesh in report["meshes"]:
        name = " x ".join(f"{n}={s}" for n, s in zip(mesh["dim_names"], mesh["shape"]))
        for devices, live, phases in _program_series(mesh):
            left.plot(range(len(live)), live, label=f"{name} ({mesh['source']}){devices}: {phases}")
        for row in mesh["collectives"]:
            phase = "fwd" if row["phase"] == "forward" else "bwd"
            labels.append(f"{phase} {row['kind']} / {row['axis']}")
            sent.append(row["send_bytes_per_device"] / 2**30)
    left.set_xlabel("op (dispatch order; the backward's in reverse)")
    left.set_ylabel("activations (+ gradients) per device (GiB)")
    left.set_title(f"memory over the step ({report['mode']}, {report['devices']} devices)")
    if report["meshes"]:
        left.legend(fontsize=7)
    right.barh(labels or ["none"], sent or [0])
    right.invert_yaxis()
    right.set_xlabel("GiB sent per device per step")
    right.set_title("communication per mesh axis")
    right.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _program_series(mesh: Dict):
    """(devices label, GiB per op, phases) for each distinct program of `mesh`: the representative
    devices' series first (label empty), then each `programs` entry's (after a training step its
    step-memory series, else its forward live bytes)."""
    step = mesh.get("step_memory") or {}
    if step.get("timeline"):  # forward, backward, update: activations + gradients
        yield "", [(a + g) / 2**30 for _, _, a, g in step["timeline"]], "forward, backward, update"
        for program in step.get("programs", []):
            yield (f", devices {','.join(map(str, program['ranks']))}",
                   [(a + g) / 2**30 for _, _, a, g in program["timeline"]], "forward, backward, update")
        return
    yield "", [b / 2**30 for _, b in mesh.get("memory_timeline", [])], "forward"
    for program in mesh.get("programs", []):
        yield f", devices {program['devices']}", [b / 2**30 for _, b in program["memory_timeline"]], "forward"
