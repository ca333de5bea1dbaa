"""`mindspore-hyper run`: a script written for HyperParallel, on this package, with the report.

    mindspore-hyper run [--devices N] [--hardware P] [--json R] script.py [args...]  simulation, N devices
    mindspore-hyper run --processes N [--json REPORT] script.py [args...]       msrun, N processes
    mindspore-hyper run --devices N --per-rank script.py [args...]             simulation, once per rank

`import hyper_parallel` in the script resolves to mindspore_hyper.hyper_parallel (unless upstream's
package is installed). The script runs unchanged: in simulation once for all N devices, under
msrun once per process (each one rank); with --per-rank once per simulated device, each run as
that rank (for scripts that build rank-specific pieces: pipeline stages). Afterwards the
per-device memory and collectives of every device mesh the script used are printed, and with
--json written (under msrun one file per rank, REPORT.rankR). Under msrun the console shows the
workers' output without MindSpore's start-up notices (launch/worker_console.py; the logs in
--log-dir keep every line) and rank 0's report; every rank's is in LOG_DIR/report_rank<R>.txt. A rank
that fails ends the job at once with its error (launch/rank_failure.py). With --hardware (simulation) each
mesh's step time is predicted on that hardware from the recorded compute and collectives, as
`mindspore-hyper dryrun --hardware` does.
"""
from __future__ import annotations

import argparse
import os
import sys

from mindspore_hyper.cli.arg_types import positive_int
from mindspore_hyper.cli.dryrun import add_hardware_argument, report_completion
from mindspore_hyper.cli.report_plot import add_plot_argument

__all__ = ["add_parser", "run"]

EXAMPLES = """\
examples (<your_script.py>: a placeholder for your script, such as examples/hyper_parallel_llama.py):
  mindspore-hyper run --devices 8 <your_script.py> --steps 5
  mindspore-hyper run --devices 8 --hardware ascend-910c <your_script.py>
  mindspore-hyper run --processes 4 --json report.json <your_script.py>"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `run` subcommand."""
    p = subparsers.add_parser("run", help="run a HyperParallel-API script (simulation or msrun) with the report",
                              description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--devices", type=positive_int, default=8, help="simulated devices (default 8)")
    where.add_argument("--processes", type=positive_int, help="run under msrun with this many local processes")
    p.add_argument("--per-rank", action="store_true",
                   help="simulation: run the script once per device, each run as that rank (scripts that build "
                        "rank-specific pieces, such as pipeline stages)")
    add_hardware_argument(p)
    p.add_argument("--json", metavar="REPORT", help="write the report as JSON (under msrun: REPORT.rankR)")
    add_plot_argument(p, " (simulation)")
    p.add_argument("--log-dir", default="msrun_log", help="msrun's log folder with --processes (default msrun_log)")
    p.add_argument("script", help="the script to run")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")
    p.set_defaults(func=run, parser=p)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the script (see module docstring); returns its exit code."""
    if not os.path.isfile(args.script):
        raise FileNotFoundError(f"no script {args.script!r}")
    if args.processes is None:
        from mindspore_hyper.hyper_parallel.script_runner import run_script

        return run_script(args.script, list(args.script_args), args.devices, args.json,
                          complete=report_completion(args),
                          per_rank=args.per_rank)
    if args.per_rank:
        raise ValueError("--per-rank: under msrun (--processes) each process is one rank already; drop the flag")
    if args.hardware:
        raise ValueError("--hardware: the prediction is made from the simulation's report; run with --devices N "
                         "(or `mindspore-hyper dryrun --hardware`)")
    if args.fragmentation is not None:
        raise ValueError("--fragmentation: under msrun set MS_HYPER_ALLOCATOR_FRAGMENTATION in the environment (each "
                         "rank reads it as the context flag allocator_fragmentation)")
    if args.plot:
        raise ValueError("--plot: the per-rank reports of an msrun job are written with --json (one per rank); "
                         "plot in simulation (--devices N)")
    from mindspore_hyper.cli.msrun import msrun_command
    from mindspore_hyper.hyper_parallel import script_runner
    from mindspore_hyper.launch.elastic import _free_port
    from mindspore_hyper.launch.worker_console import WorkerConsole

    os.makedirs(args.log_dir, exist_ok=True)
    worker = [script_runner.__file__, "--report-dir", os.path.abspath(args.log_dir)]
    worker += ["--json", os.path.abspath(args.json)] if args.json else []
    executable, argv, env = msrun_command([
        f"--worker_num={args.processes}", f"--local_worker_num={args.processes}", f"--master_port={_free_port()}",
        f"--log_dir={args.log_dir}", *WorkerConsole.msrun_arguments(args.processes), *worker, args.script,
        *args.script_args])
    env["MS_HYPER_MODE"] = "distributed"
    console = WorkerConsole(args.log_dir, args.processes)
    returncode = console.run(argv, env)
    from mindspore_hyper.comm.shm import cleanup_stale_segments

    cleanup_stale_segments()  # segments of workers msrun killed (their creators are gone; live jobs' stay)
    if console.failure is not None:  # the console stopped the job at once (launch/worker_console.py)
        print(f"mindspore-hyper run: {console.failure}; the job was ended at once (every other rank stopped); the "
              f"workers' logs are in {args.log_dir}/worker_*.log", file=sys.stderr)
    elif returncode:
        print(f"mindspore-hyper run: msrun exited with {returncode}; the workers' logs are in "
              f"{args.log_dir}/worker_*.log", file=sys.stderr)
    return returncode
