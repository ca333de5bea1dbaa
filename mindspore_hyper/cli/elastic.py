"""`mindspore-hyper elastic`: run a training script under msrun, restarting it on the processes
that remain when a worker dies (mindspore_hyper/launch/elastic.py)."""
from __future__ import annotations

import argparse

from mindspore_hyper.cli.arg_types import nonnegative_int, positive_int
from mindspore_hyper.cli.common import add_command

__all__ = ["add_parser", "run"]

EXAMPLES = """\
examples:
  mindspore-hyper elastic --nproc 4 --nproc-multiple 2 --log-dir logs train.py --ckpt ckpt
  mindspore-hyper elastic --nproc 8 --min-nproc 4 --max-restarts 5 --attempt-timeout 7200 --log-dir logs train.py
  (train.py resumes from its newest committed checkpoint itself; see docs/checkpoint.md)"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `elastic` subcommand."""
    p = add_command(subparsers, "elastic", "run a training script under msrun, restarting it on the processes left",
                    "Launch `msrun --worker_num=N --local_worker_num=N script args` on this host; when a worker is "
                    "killed by a signal (a lost process) restart the job on the largest multiple of --nproc-multiple "
                    "processes left, on any other failure restart it on the same number, at most --max-restarts "
                    "times. The script resumes from its checkpoint (load_checkpoint reshards it) and resizes its "
                    "strategy with mindspore_hyper.launch.elastic_strategy.", EXAMPLES)
    p.add_argument("--nproc", type=positive_int, required=True, help="processes of the first attempt")
    p.add_argument("--min-nproc", dest="min_nproc", type=positive_int, default=1,
                   help="the fewest processes worth running on (default 1)")
    p.add_argument("--nproc-multiple", dest="nproc_multiple", type=positive_int, default=1,
                   help="world sizes must be multiples of it: the product of the strategy's non-data axes (default 1)")
    p.add_argument("--max-restarts", dest="max_restarts", type=nonnegative_int, default=3,
                   help="restarts after the first attempt (default 3)")
    p.add_argument("--attempt-timeout", dest="attempt_timeout", type=positive_int, default=None, metavar="SECONDS",
                   help="interrupt an attempt after this long (default: no limit)")
    p.add_argument("--log-dir", dest="log_dir", required=True, help="msrun's logs, one attempt_<k>/ folder per attempt")
    p.add_argument("script", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    p.set_defaults(func=run, parser=p)
    return p


def run(args: argparse.Namespace) -> int:
    from mindspore_hyper.launch import run_elastic

    result = run_elastic(args.script, args.script_args, nproc=args.nproc, log_dir=args.log_dir,
                         min_nproc=args.min_nproc, nproc_multiple=args.nproc_multiple,
                         max_restarts=args.max_restarts, attempt_timeout=args.attempt_timeout)
    sizes = " -> ".join(str(a.world_size) for a in result.attempts)
    print(f"finished after {len(result.attempts)} attempt(s) on {sizes} processes")
    return 0
