"""Parser pieces shared by the subcommands: the command itself and the model flags."""
from __future__ import annotations

import argparse
import json

from mindspore_hyper.cli.arg_types import json_object, positive_int
from mindspore_hyper.cli.model_spec import GPT_DEFAULTS, GPT_PRESET

__all__ = ["add_command", "add_model_arguments"]


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
    group.add_argument("--batch", type=positive_int, default=8, help="gpt preset: global batch (default 8)")
