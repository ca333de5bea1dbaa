"""A cluster that never forms is not silent (issue 42): past a normal start's few "Topology build timed
out" retries, the console prints one line every 20 retries naming the waiting workers and what to check."""
import io
import sys
import textwrap

import pytest

from mindspore_hyper.launch.cluster_forming import ClusterFormingWatch, retry_of
from mindspore_hyper.launch.worker_console import WorkerConsole, is_harmless


def recorded(n, stamp):
    """A worker's "Topology build timed out" notice as MindSpore 2.10.0 wrote it in a 2-rank msrun job
    on this machine whose rank 1 never started (`--worker_num=2 --local_worker_num=1
    --cluster_time_out=30`: 60 retries, 0.5 s apart, then the worker failed)."""
    return (f"[WARNING] DISTRIBUTED(21007,7f8003635b80,python):2026-12-07-05:{stamp} [mindspore/ccsrc/cluster/"
            f"topology/cluster_context.cc:316] BuildCluster] Topology build timed out., retry({n}/60).")


# (retry, timestamp) of that run's worker_0.log, verbatim
NEVER_FORMS = [(1, "12:54.080.543"), (2, "12:54.582.408"), (19, "13:03.115.906"), (20, "13:03.618.732"),
               (21, "13:04.122.768"), (39, "13:13.166.983"), (40, "13:13.672.259"), (60, "13:23.743.690")]
HINT = "check --master_addr/--master_port and that every rank started"


def test_a_normal_start_prints_nothing_and_a_cluster_that_never_forms_prints_every_20_retries():
    watch = ClusterFormingWatch()
    lines = [recorded(n, t) for n, t in NEVER_FORMS]
    assert all(is_harmless(line) for line in lines)  # each notice itself stays off the console
    said = [watch.feed(0, line) for line in lines]
    assert said[:3] == [None] * 3 and said[4] is None and said[5] is None
    assert said[3] == ("waiting for the cluster to form: retry 20 of 60 (MindSpore's 'Topology build timed out' "
                       f"notices, 9.5 s since the first; worker 0 at retry 20); {HINT}")
    assert said[6].startswith("waiting for the cluster to form: retry 40 of 60 (")
    assert "19.6 s since the first" in said[6]
    assert said[7].startswith("waiting for the cluster to form: retry 60 of 60 (")
    assert retry_of(lines[0])[:2] == (1, 60) and retry_of("step 1: loss 0.5") is None


def test_one_line_per_20_retries_of_the_job_naming_every_waiting_worker():
    watch = ClusterFormingWatch()
    assert watch.feed(1, recorded(19, "13:03.115.906")) is None
    assert watch.feed(0, recorded(18, "13:03.015.906")) is None
    line = watch.feed(1, recorded(20, "13:03.618.732"))
    assert "retry 20 of 60" in line and "worker 0 at retry 18, worker 1 at retry 20" in line
    assert "0.6 s since the first" in line  # the first notice seen was worker 0's, 0.6 s earlier
    assert watch.feed(0, recorded(20, "13:03.518.732")) is None  # retry 20 was said already
    assert watch.feed(0, recorded(45, "13:16.100.000")) is not None  # skipped past 40: one line
    assert watch.feed(1, recorded(59, "13:23.000.000")) is None and watch.feed(1, recorded(60, "13:23.5.0"))


def test_bad_every_is_refused():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match=r"every=.*: expected an int >= 1"):
            ClusterFormingWatch(bad)


def test_the_console_prints_the_watch_line_to_its_error_stream(tmp_path):
    """A stand-in for msrun writes a worker log of 45 notices (a worker alone for 22 s): two lines
    on the error stream, none of the notices on the console."""
    log = "".join(recorded(n, f"13:{n // 2 + 10:02d}.{500 * (n % 2):03d}.000") + "\n" for n in range(1, 46))
    fake_msrun = textwrap.dedent(f"""
        with open({str(tmp_path / 'worker_0.log')!r}, "w") as f:
            f.write({log!r} + "rank 0: gave up\\n")
    """)
    out, err = io.StringIO(), io.StringIO()
    assert WorkerConsole(str(tmp_path), 1, out=out, err=err, poll_s=0.05).run([sys.executable, "-c", fake_msrun],
                                                                              {}) == 0
    assert out.getvalue().splitlines() == ["rank 0: gave up"]
    said = err.getvalue().splitlines()
    assert [s.split(" (")[0] for s in said] == ["waiting for the cluster to form: retry 20 of 60",
                                                "waiting for the cluster to form: retry 40 of 60"]
    assert all(s.endswith(HINT) and "worker 0 at retry" in s for s in said)
