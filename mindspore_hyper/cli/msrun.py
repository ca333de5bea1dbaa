"""`mindspore-hyper msrun ARGS`: MindSpore's msrun, with this package's interpreter first on PATH.

msrun starts each worker as `python script.py` with whatever `python` the PATH finds first; from
a shell where the virtual environment is not activated that is another interpreter, and every
worker stops at `No module named 'mindspore_hyper'` (msrun itself prints only "Distributed job
exited with exception"). This command runs the msrun next to the interpreter it runs in (the
virtual environment's) with that interpreter's folder first on PATH, so `.venv/bin/mindspore-hyper
msrun ...` works from any shell. Every argument goes to msrun unchanged (`--help` included).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Tuple

__all__ = ["add_parser", "run", "msrun_command"]

EXAMPLES = """\
examples:
  MS_HYPER_MODE=distributed .venv/bin/mindspore-hyper msrun --worker_num=4 --local_worker_num=4 \\
      --master_port=8118 --log_dir=msrun_log --join=True examples/train_transformer.py
  .venv/bin/mindspore-hyper msrun --help        (msrun's own flags)"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `msrun` subcommand (its arguments are msrun's: '-' starts none of ours)."""
    p = subparsers.add_parser(
        "msrun", help="msrun with the package's interpreter first on PATH (works without an activated venv)",
        description=__doc__.split("\n\n")[1], epilog=EXAMPLES, prefix_chars="+",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("msrun_args", nargs=argparse.REMAINDER, help="msrun's arguments, then the script and its arguments")
    p.set_defaults(func=run, parser=p)
    return p


def msrun_command(msrun_args: List[str], environ=None) -> Tuple[str, List[str], dict]:
    """(executable, argv, environment) of the msrun to start: the msrun beside `sys.executable`,
    its folder first on the environment's PATH.

    Raises:
        ValueError: no arguments (msrun needs at least the script).
        FileNotFoundError: no msrun beside the interpreter (MindSpore not installed there).
    """
    if not msrun_args:
        raise ValueError("give msrun's arguments and the script, e.g. --worker_num=2 --local_worker_num=2 "
                         "--master_port=8118 --log_dir=msrun_log --join=True train.py")
    bindir = os.path.dirname(sys.executable)
    executable = os.path.join(bindir, "msrun")
    if not os.path.exists(executable):
        raise FileNotFoundError(f"no msrun beside this interpreter ({executable}); install mindspore into "
                                f"{os.path.dirname(bindir)}")
    env = dict(os.environ if environ is None else environ)
    env["PATH"] = bindir + os.pathsep + env["PATH"] if env.get("PATH") else bindir
    return executable, [executable, *msrun_args], env


def run(args: argparse.Namespace) -> int:
    """Replace this process by msrun (its exit status and signals are the command's)."""
    executable, argv, env = msrun_command(list(args.msrun_args))
    sys.stdout.flush()
    os.execve(executable, argv, env)
    return 0  # not reached
