"""`mindspore-hyper dryrun`: the script's own model on N devices, shapes and bytes only.

    mindspore-hyper dryrun [--devices N] [--hardware PRESET] [--json REPORT] script.py [args...]

The script runs unchanged in the dry-run mode (`set_context(mode="dryrun")`): models wrapped by
`auto_parallelize` and HyperParallel-API code lay their tensors out on N devices, but tensors
carry shape, dtype and layout only, so a model far larger than this machine runs in seconds
(build it under MindSpore's `no_init_parameters()` so its weights are never allocated). Printed
afterwards, per mesh: each device's parameters, gradients, optimizer states and peak
activations (and the op where the peak is reached), every collective with its axis and bytes,
and with --hardware the predicted step time; --plot draws memory over the step and communication
per axis. The JSON has the schema of `mindspore-hyper run --json` (docs/dryrun.md).
"""
from __future__ import annotations

import argparse
import os

from mindspore_hyper.cli.arg_types import positive_int
from mindspore_hyper.cli.report_plot import add_plot_argument, plot_report

__all__ = ["add_parser", "run", "add_hardware_argument", "load_hardware_argument", "report_completion", "add_predictions"]

EXAMPLES = """\
examples:
  mindspore-hyper dryrun --devices 2048 --hardware ascend-910c examples/dryrun_llm.py
  mindspore-hyper dryrun --devices 128 --json report.json my_training_script.py --steps 1"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `dryrun` subcommand."""
    p = subparsers.add_parser("dryrun", help="a training script on N devices, shapes and bytes only (memory, "
                                             "collectives, predicted step time)",
                              description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=positive_int, default=8, help="devices of the job (default 8)")
    add_hardware_argument(p)
    p.add_argument("--json", metavar="REPORT", help="write the report as JSON")
    add_plot_argument(p)
    p.add_argument("script", help="the script to run")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")
    p.set_defaults(func=run, parser=p)
    return p


def add_hardware_argument(p: argparse.ArgumentParser) -> None:
    """`--hardware PRESET`: predict each mesh's step time on that hardware (dryrun and run)."""
    from mindspore_hyper.estimate.hardware import hardware_presets

    p.add_argument("--hardware", metavar="PRESET",
                   help=f"predict the step time on this hardware: one of {', '.join(hardware_presets())} or a "
                        ".yaml path; its allocator's block rounding is the report's (default 512 bytes, MindSpore's "
                        "memory pool)")
    p.add_argument("--fragmentation", metavar="FRACTION", type=float,
                   help="fragmentation allowance: the step peak with the allocator's rounding x (1 + FRACTION), "
                        "in [0, 1] (default: the --hardware preset's, else 0)")


def load_hardware_argument(args: argparse.Namespace):
    """The `--hardware` preset loaded (None without the flag), before the script runs.

    Raises:
        ValueError: an unknown preset, naming the known ones.
    """
    if not args.hardware:
        return None
    from mindspore_hyper.estimate.hardware import load_hardware

    return load_hardware(args.hardware)


def report_completion(args: argparse.Namespace):
    """What `run` and `dryrun` add to the report before it is printed: each mesh's predicted step
    time with --hardware (the preset loaded now, so a bad name fails before the script runs) and
    the --plot picture. Sets the context's allocator flags (the preset's rounding and
    fragmentation, --fragmentation over it) before the script runs.

    Raises:
        ValueError: an unknown hardware preset, or --fragmentation outside [0, 1].
    """
    from mindspore_hyper.context import set_context

    hardware = load_hardware_argument(args)
    if hardware is not None:  # read when each step's report is built, during the script
        set_context(allocator_alignment=hardware.allocator_alignment, allocator_fragmentation=hardware.fragmentation)
    if getattr(args, "fragmentation", None) is not None:
        try:
            set_context(allocator_fragmentation=args.fragmentation)
        except ValueError as error:
            raise ValueError(f"--fragmentation {args.fragmentation:g}: expected a fraction in [0, 1]") from error

    def complete(report: dict) -> None:
        if hardware is not None:
            add_predictions(report, hardware)
        if args.plot:
            plot_report(report, args.plot)
    return complete


def add_predictions(report: dict, hardware) -> None:
    """Add each mesh's predicted step time on `hardware` (`estimate.dryrun_time`) to `report`: each
    program of its own (`programs`: e.g. an expert member under a routing histogram) gets its own
    from its ops and collectives, and the mesh's `predicted` is the slowest program's (the step
    waits for its slowest device; `slowest_devices` names them: null for the representative's, the
    devices of no program of their own). A pipeline's stages take their slowest program each
    (`predict_pipeline_step`)."""
    from mindspore_hyper.estimate.dryrun_time import predict_pipeline_step, predict_step

    for mesh in report["meshes"]:
        if "pipeline" in mesh:
            mesh["predicted"] = predict_pipeline_step(mesh, hardware).to_dict()
            continue
        training = mesh.get("training_step", True)
        slowest, devices = predict_step(mesh, hardware, training=training).to_dict(), None
        for program in mesh.get("programs", ()):
            own = dict(mesh, compute=program["compute"], collectives=program["collectives"])
            program["predicted"] = predict_step(own, hardware, training=training).to_dict()
            if program["predicted"]["step_seconds"] > slowest["step_seconds"]:
                slowest, devices = program["predicted"], program["devices"]
        mesh["predicted"] = dict(slowest, slowest_devices=devices)
        if mesh.get("programs"):
            mesh["predicted"]["notes"] = slowest["notes"] + [
                f"the slowest of the mesh's {len(mesh['programs']) + 1} device programs: "
                + ("the representative's (devices with no program of their own)" if devices is None
                   else f"devices {devices}") + "; the step waits for it"]


def run(args: argparse.Namespace) -> int:
    """Run the script in the dry-run mode (see module docstring); returns its exit code.

    Raises:
        FileNotFoundError: no such script.
        ValueError: an unknown hardware preset (before the script runs).
    """
    if not os.path.isfile(args.script):
        raise FileNotFoundError(f"no script {args.script!r}")
    complete = report_completion(args)
    from mindspore_hyper.hyper_parallel.script_runner import run_script

    return run_script(args.script, list(args.script_args), args.devices, args.json, mode="dryrun", complete=complete)
