"""A failing rank ends a `mindspore-hyper run --processes` job at once: the rank reports its error
(launch/rank_failure.py, written by the worker entry script_runner.py) and the console stops msrun
(its SIGINT), or msrun's own line about a worker killed by a signal does. Stand-ins for msrun here;
the real job: tests/hyper_parallel/test_msrun.py's failing-rank test."""
import io
import sys
import textwrap

import pytest

from mindspore_hyper.hyper_parallel import script_runner
from mindspore_hyper.launch.rank_failure import RankFailure, find_rank_failure, write_rank_failure
from mindspore_hyper.launch.worker_console import WorkerConsole


def fake_msrun(then: str) -> str:
    """A stand-in for msrun: prints a line, runs `then`, then waits (up to 120 s, a hang guard that
    exits 7) for the job to end; on SIGINT it stops, as msrun's handler does (exit status 0)."""
    return textwrap.dedent(f"""
        import signal, sys, time
        def stop(*_):
            print("msrun: SIGINT, killing every worker", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGINT, stop)
        print("Start worker process with rank id:0", flush=True)
        {then}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # short sleeps: the SIGINT handler runs within one
            time.sleep(0.05)
        sys.exit(7)
    """)


def run_console(tmp_path, then):
    out, err = io.StringIO(), io.StringIO()
    console = WorkerConsole(str(tmp_path), 2, out=out, err=err, poll_s=0.05)
    code = console.run([sys.executable, "-c", fake_msrun(then)], {})
    return console, code, out.getvalue().splitlines(), err.getvalue().splitlines()


def test_a_rank_reporting_its_failure_ends_the_job_with_its_error(tmp_path):
    write = (f"from mindspore_hyper.launch.rank_failure import write_rank_failure; "
             f"write_rank_failure({str(tmp_path)!r}, 1, 'RuntimeError: rank 1 fails')")
    console, code, out, _ = run_console(tmp_path, write)
    assert console.failure == "rank 1 failed: RuntimeError: rank 1 fails"
    assert "msrun: SIGINT, killing every worker" in out  # msrun stopped by the console, not by its timeout
    assert code == 1  # msrun's handler exits 0: the job still failed


def test_a_worker_msrun_saw_killed_ends_the_job(tmp_path):
    line = "Worker process 4242 exit with exception. Error code: -9."
    console, code, out, err = run_console(tmp_path, f"print({line!r}, file=sys.stderr, flush=True)")
    assert console.failure == "worker pid 4242 was killed by signal 9 (SIGKILL)"
    assert line in err and "msrun: SIGINT, killing every worker" in out and code == 1


def test_an_earlier_jobs_failure_does_not_end_a_new_job(tmp_path):
    write_rank_failure(str(tmp_path), 0, "RuntimeError: the last job's")
    out = io.StringIO()
    console = WorkerConsole(str(tmp_path), 2, out=out, err=io.StringIO(), poll_s=0.05)
    code = console.run([sys.executable, "-c", "import time; time.sleep(0.3); print('done', flush=True)"], {})
    assert code == 0 and console.failure is None and out.getvalue().splitlines() == ["done"]
    assert find_rank_failure(str(tmp_path)) is None


def test_the_worker_entry_reports_its_failure(tmp_path, monkeypatch, capsys):
    def fails(*args, **kwargs):
        raise RuntimeError("rank 3 fails\n----\n- C++ Call Stack: ...")

    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("RANK_ID", "3")
    monkeypatch.setattr(script_runner, "run_script", fails)
    assert script_runner._main(["--report-dir", str(tmp_path), "script.py"]) == 1
    assert find_rank_failure(str(tmp_path)) == RankFailure(3, "RuntimeError: rank 3 fails")
    assert "RuntimeError: rank 3 fails" in capsys.readouterr().err  # the traceback in its log
    monkeypatch.setattr(script_runner, "run_script", lambda *a, **k: 5)  # the script's sys.exit(5)
    assert script_runner._main(["--report-dir", str(tmp_path), "script.py"]) == 5
    assert find_rank_failure(str(tmp_path)) == RankFailure(3, "the script exited with status 5")
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")  # msrun's scheduler runs the same command: it reports nothing
    monkeypatch.setattr(script_runner, "run_script", fails)
    with pytest.raises(RuntimeError, match="rank 3 fails"):
        script_runner._main(["--report-dir", str(tmp_path / "elsewhere"), "script.py"])
    assert not (tmp_path / "elsewhere").exists()
