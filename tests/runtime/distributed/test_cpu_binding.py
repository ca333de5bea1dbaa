"""The cpu_binding flag: which cores each process of a host gets (blocks, or round robin when
processes outnumber cores), every thread moved, a process bound already left alone, the hybrid
transport's processes counted per host, MindSpore's transport and `none` left unbound. Binding
changes the process, so each case runs in a fresh interpreter."""
import json
import os
import subprocess
import sys

import pytest

import mindspore_hyper as mh
from mindspore_hyper.runtime.distributed.cpu_binding import cores_for
from paths import REPO_ROOT


def test_blocks_when_cores_allow():
    assert cores_for(0, 2, range(8)) == {0, 1, 2, 3}
    assert cores_for(1, 2, range(8)) == {4, 5, 6, 7}
    assert [sorted(cores_for(i, 3, range(8))) for i in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert cores_for(1, 2, [7, 3, 5, 9]) == {7, 9}  # the allowed cores, in order, whatever their numbers
    assert cores_for(0, 1, [4, 5]) == {4, 5}


def test_round_robin_when_processes_outnumber_cores():
    # neighbouring ranks (one tensor-parallel pair of data 2 x tensor 2) on different cores
    assert [sorted(cores_for(i, 4, [0, 1])) for i in range(4)] == [[0], [1], [0], [1]]
    assert [sorted(cores_for(i, 5, [2, 6])) for i in range(5)] == [[2], [6], [2], [6], [2]]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="local_index=2 is outside the host's 2 processes"):
        cores_for(2, 2, [0, 1])
    with pytest.raises(ValueError, match="no core"):
        cores_for(0, 2, [])
    with pytest.raises(ValueError, match="cpu_binding='pin'"):
        mh.set_context(cpu_binding="pin")


PROGRAM = """
import json, os, threading
from mindspore_hyper.runtime.distributed.world import World
from mindspore_hyper.runtime.distributed.cpu_binding import bind_to_cores
stop = threading.Event()
worker = threading.Thread(target=stop.wait)  # a thread started before the binding
worker.start()
{setup}
result = {call}
threads = sorted({{tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")}})
stop.set()
print(json.dumps({{"result": None if result is None else sorted(result), "threads": threads}}))
"""


def run(call: str, setup: str = "", **env) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MS_HYPER_")}
    full.update(env, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-c", PROGRAM.format(call=call, setup=setup)], capture_output=True,
                          text=True, env=full, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def all_cores():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < os.cpu_count():
        pytest.skip(f"this test process is bound to {cores} already (binding needs the whole machine)")
    if len(cores) < 2:
        pytest.skip("one core: nothing to choose between")
    return cores


def test_every_thread_moves_to_its_cores():
    cores = all_cores()
    out = run("bind_to_cores(1, 2)")
    assert out["result"] == sorted(cores_for(1, 2, cores))
    assert out["threads"] == [out["result"]]  # the thread started before the binding too


def test_a_process_bound_already_is_left_alone():
    cores = all_cores()
    out = run("bind_to_cores(0, 4)", setup=f"os.sched_setaffinity(0, {{{cores[-1]}}})")
    assert out["result"] is None
    assert [cores[-1]] in out["threads"]


def test_one_process_on_the_host_is_left_alone():
    cores = all_cores()
    out = run("bind_to_cores(0, 1)")
    assert out["result"] is None and out["threads"] == [cores]


def test_world_counts_its_hosts_processes_and_honours_the_flag():
    cores = all_cores()
    # hybrid: ranks 2 and 3 share a host, so rank 2 is process 0 of 2 there
    out = run("World(2, 4, 'job', 'hybrid', 10.0, hosts=(7, 7, 9, 9))._bind_cores()")
    assert out["result"] == sorted(cores_for(0, 2, cores))
    out = run("World(3, 4, 'job', 'shm', 10.0)._bind_cores()")
    assert out["result"] == sorted(cores_for(3, 4, cores))
    assert run("World(1, 2, 'job', 'mindspore', 10.0)._bind_cores()")["result"] is None  # hosts unknown
    out = run("World(1, 2, 'job', 'shm', 10.0)._bind_cores()", MS_HYPER_CPU_BINDING="none")
    assert out["result"] is None and out["threads"] == [cores]
