"""Parser pieces shared by the subcommands: the command itself and the model flags."""
from __future__ import annotations

import argparse
import json

from mindspore_hyper.cli.arg_types import json_object, positive_int
from mindspore_hyper.cli.model_spec import GPT_DEFAULTS, GPT_PRESET, parse_input_spec

__all__ = ["add_command", "add_model_arguments", "check_model_arguments", "GPT_BATCH"]

GPT_BATCH = 8


def add_command(subparsers, name: str, summary: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """A subcommand parser with `epilog` (its examples) kept as written."""
    return subparsers.add_parser(name, help=summary, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def add_model_arguments(parser: argparse.ArgumentParser, model_help: str, inputs_help: str) -> None:
    """--model, --init-args, --inputs, --batch: the model a command builds (cli/model_spec.py)."""
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=GPT_PRESET, metavar="SPEC", help=model_help)
    group.add_argument("--init-args", dest="init_args", type=json_object, default={}, metavar="JSON",
                       help=f"keyword arguments of the model class (gpt defaults: {json.dumps(GPT_DEFAULTS)})")
    group.add_argument("--inputs", nargs="+", metavar="SPEC", help=inputs_help)
    group.add_argument("--batch", type=positive_int, help=f"gpt preset: global batch (default {GPT_BATCH})")


def check_model_arguments(args: argparse.Namespace, example_inputs: str) -> None:
    """Check the model flags together (before anything heavy is imported) and fill --batch.

    Raises:
        ValueError: a class without --inputs, --batch where --inputs give the shapes, a bad input spec.
    """
    if args.model != GPT_PRESET and args.inputs is None:
        raise ValueError(f"--model {args.model}: give its --inputs (e.g. {example_inputs})")
    if args.batch is not None and args.inputs is not None:
        raise ValueError("--batch sets the gpt preset's batch; with --inputs their shapes give the batch")
    for spec in args.inputs or ():
        parse_input_spec(spec)
    if args.batch is None:
        args.batch = GPT_BATCH
