"""Run a HyperParallel-API script on this package: in simulation (one process, N devices) or as
one msrun worker (this file is also the script msrun starts for `mindspore-hyper run --processes`).

    python script_runner.py [--json REPORT] [--report-dir DIR] SCRIPT [ARGS...]   (as an msrun worker)

As an msrun worker with `--report-dir` (what `mindspore-hyper run --processes` passes: its log
folder), every rank writes its report to DIR/report_rank<R>.txt and only rank 0 prints it, so the
console shows it once; without it every rank prints its own. A rank whose script fails (raises, or
exits with a non-zero status) prints its traceback, then reports the error into DIR
(`launch/rank_failure.py`): the console ends the job at once with it.
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from typing import Callable, Dict, List, Optional

__all__ = ["run_script", "under_msrun"]


def under_msrun() -> bool:
    """Whether this process is an msrun worker or its scheduler."""
    return "MS_WORKER_NUM" in os.environ or "MS_ROLE" in os.environ


def run_script(script: str, args: List[str], devices: Optional[int], json_path: Optional[str] = None,
               mode: str = "simulation", complete: Optional[Callable[[Dict], None]] = None,
               per_rank: bool = False, report_dir: Optional[str] = None) -> int:
    """Install the `hyper_parallel` import, set the mode, run `script` as `__main__` with `args`,
    then print (and write to `json_path`) the per-device report.

    Args:
        script: the script's path.
        args: its arguments (its `sys.argv[1:]`).
        devices: devices of the one-process modes; None under msrun (each process is one rank).
        json_path: where to write the report; under msrun each rank writes PATH.rankR.
        mode: the one-process mode: "simulation" (values) or "dryrun" (shapes and bytes only).
        complete: adds to the report before it is printed (e.g. predicted step times).
        per_rank: in simulation, run the script once per device, each run as that rank
            (rank_threads.py: for scripts that build rank-specific pieces, such as pipeline stages).
        report_dir: under msrun, each rank writes its report's text to
            DIR/report_rank<R>.txt and only rank 0 prints it (None: every rank prints its own).

    Returns:
        0, or the script's `SystemExit` code.

    Raises:
        FileNotFoundError: no such script.
        ValueError: `per_rank` outside the simulation.
    """
    import mindspore as ms

    from mindspore_hyper.context import set_context
    from mindspore_hyper.hyper_parallel.install import install_hyper_parallel
    from mindspore_hyper.hyper_parallel.report import format_report, session_report
    from mindspore_hyper.runtime.parallel_model import keeping_models

    if not os.path.isfile(script):
        raise FileNotFoundError(f"no script {script!r}")
    if per_rank and devices is None:
        raise ValueError("per_rank: under msrun each process is one rank already")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    if devices is None:
        set_context(mode="distributed")
        # HyperParallel scripts may use MindSpore's communication themselves (init(), get_rank()):
        # the cluster forms in every case, msrun's scheduler serving it until the workers finish
        from mindspore.communication import init

        init()
        from mindspore_hyper.runtime.distributed.world import world

        rank, size = world().rank, world().size
    else:
        set_context(mode=mode, device_num=devices)
        rank, size = None, devices
        from mindspore_hyper.parallelize import RUNTIMES

        if per_rank and not RUNTIMES[mode]().computes_values():
            raise ValueError(f"per_rank: mode {mode!r} records shapes only, and a per-rank run exchanges values "
                             f"between its ranks; run it in simulation")
    install_hyper_parallel()
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    with keeping_models(), _communication(devices):  # the script's models outlive its main() for the report
        try:
            if per_rank:
                from mindspore_hyper.hyper_parallel.rank_threads import run_per_rank

                code = run_per_rank(script, devices)
            else:
                runpy.run_path(script, run_name="__main__")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path
        report = session_report(mode if rank is None else f"distributed (rank {rank})", size)
    if complete is not None:
        complete(report)
    text = format_report(report)
    if rank is not None and report_dir is not None:
        with open(os.path.join(report_dir, f"report_rank{rank}.txt"), "w") as f:
            f.write(text + "\n")
        if rank == 0:
            print(text + f"\n(rank 0's report; every rank's: {os.path.join(report_dir, 'report_rank<R>.txt')})",
                  flush=True)
    else:
        print(text, flush=True)
    if json_path:
        path = json_path if rank is None else f"{json_path}.rank{rank}"
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
    return code


def _communication(devices: Optional[int]):
    """In simulation, MindSpore's `mindspore.communication` speaks for the simulated job
    (rank_threads.simulated_communication: a rank query outside a per-rank run is refused, as the
    API's `get_rank()` is); under msrun (`devices` None) MindSpore's own answers."""
    from contextlib import nullcontext

    if devices is None:
        return nullcontext()
    from mindspore_hyper.hyper_parallel.rank_threads import simulated_communication
    from mindspore_hyper.hyper_parallel.session import refuse_in_simulation

    return simulated_communication(devices, refuse_in_simulation)


def _main(argv: List[str]) -> int:
    options = {"--json": None, "--report-dir": None}
    while argv[:1] and argv[0] in options and len(argv) > 1:
        options[argv[0]], argv = argv[1], argv[2:]
    if not argv:
        print("usage: script_runner.py [--json REPORT] [--report-dir DIR] SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    report_dir = options["--report-dir"]
    worker = report_dir is not None and os.environ.get("MS_ROLE") == "MS_WORKER"  # not msrun's scheduler
    try:
        code = run_script(argv[0], argv[1:], None, options["--json"], report_dir=report_dir)
    except Exception as error:  # noqa: BLE001 - reported to the console, which ends the job with it
        if not worker:
            raise
        traceback.print_exc()  # into the log first: the console stops every worker once it reads the report
        sys.stderr.flush()
        _report_failure(report_dir, error)
        return 1
    if code and worker:
        _report_failure(report_dir, f"the script exited with status {code}")
    return code


def _report_failure(report_dir: str, error) -> None:
    """Write this rank's failure (an exception, or its text) for the console (`launch/rank_failure.py`)."""
    from mindspore_hyper.launch.rank_failure import error_text, write_rank_failure

    text = error if isinstance(error, str) else error_text(error)
    write_rank_failure(report_dir, int(os.environ.get("RANK_ID", "0")), text)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
