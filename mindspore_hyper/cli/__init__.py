"""`mindspore-hyper`: the command line (docs/cli.md).

Each subcommand is a module with `add_parser(subparsers)` that adds its parser and sets
``func=run`` (``parser.set_defaults(func=run)``); `run(args)` prints its result and returns the
exit code. Adding a subcommand = adding its module to SUBCOMMANDS.

Exit codes: 0 success; 2 bad flags or input (argparse's own errors, and any ValueError or
FileNotFoundError a subcommand raises, printed with the subcommand's name); 1 a failure while
running (OSError, RuntimeError, MemoryError).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

__all__ = ["main", "build_parser", "SUBCOMMANDS"]

SUBCOMMANDS = ("mindspore_hyper.cli.estimate", "mindspore_hyper.cli.plan", "mindspore_hyper.cli.timeline",
               "mindspore_hyper.cli.tune", "mindspore_hyper.migrate.cli", "mindspore_hyper.cli.elastic",
               "mindspore_hyper.cli.msrun", "mindspore_hyper.cli.run", "mindspore_hyper.cli.dryrun")

DESCRIPTION = """\
HyperParallel for MindSpore: plan a parallel job before renting the cluster.

  estimate   memory per device of a transformer job (parameters, gradients, optimizer
             states, activations, KV cache), what fits a device, a 4K-128K sequence sweep
  plan       resolve a parallel strategy for a model and simulate one step on a CPU:
             per-device memory and collectives (and, for the GPT preset, the estimate beside it)
  timeline   a pipeline schedule's simulated timeline: bubble, in-flight microbatches,
             PNG Gantt chart, Chrome trace
  tune       HyperOffload tuners: prefetch depth or cache-block size, by running real steps
  convert    a PyTorch model -> a MindSpore Cell: editable source, checkpoint, mapping report
  elastic    run a training script under msrun, restarting it on the processes left when one dies
  msrun      MindSpore's msrun with this package's interpreter first on PATH (no venv activation)
  run        a script written for HyperParallel (import hyper_parallel), simulated on N devices
             or under msrun, with the per-device memory and collectives report
  dryrun     a training script on N devices (thousands), shapes and bytes only: per-device
             memory, collectives, predicted step time, in seconds on a laptop

Run `mindspore-hyper COMMAND --help` for each command's flags and examples."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand of SUBCOMMANDS added."""
    from mindspore_hyper import __version__

    parser = argparse.ArgumentParser(prog="mindspore-hyper", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"mindspore_hyper {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Parse `argv` (default sys.argv[1:]), run the subcommand, return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        parser.exit(2, "\nmindspore-hyper: error: a COMMAND is required\n")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        args.parser.exit(2, f"{args.parser.prog}: error: {exc}\n")
    except (OSError, RuntimeError, MemoryError) as exc:
        args.parser.exit(1, f"{args.parser.prog}: failed: {type(exc).__name__}: {exc}\n")
