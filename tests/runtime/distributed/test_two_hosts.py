"""A real second host, on one machine: two network namespaces (each its own loopback, veth
address, hostname and /dev/shm) each run their own `msrun --node_rank=...` of one 4-process job,
the master on the first namespace's veth address. With dist_transport="hybrid" the job trains
MindSpore layers (data 2 x tensor 2, ZeRO-1 Adam) like one device; groups within a host talk
over shared memory, groups across hosts through MindSpore; an asynchronous checkpoint commits
across both hosts and loads into one device with what the 4 processes held. Killing the second host's processes makes the first host's
job fail within the timeout, its log naming a lost rank. All traffic stays in the namespaces
this test creates; they are deleted afterwards, also on failure."""
import json
import os
import re
import secrets
import sys
import time

import numpy as np
import pytest

import mindspore_hyper as mh
from netns_hosts import TwoHosts, namespaces_unavailable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "checkpoint"))
from ckpt_models import adam, assemble, dense_reference, dense_stack, global_values  # noqa: E402

WORKER = os.path.join(HERE, "two_hosts_worker.py")
TIMEOUT = 15  # comm_timeout of the job: also MindSpore's node timeout (MS_NODE_TIMEOUT)
TOLERANCE = 1e-5
PORT = 29321  # inside the first namespace: nothing else listens there


def wait_for(condition, procs, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"an msrun exited with code {p.returncode} before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {seconds} s (hang)")
        time.sleep(0.2)


def held_by_ranks(out, when):
    """The global values the 4 ranks held (`when`: "initial" or "trained")."""
    return assemble([(dict(np.load(out / f"{when}{r}.npz")), json.loads((out / f"{when}{r}.json").read_text()))
                     for r in range(4)])


def logs(directory):
    text = ""
    for root, _, names in os.walk(directory):
        for name in sorted(names):
            with open(os.path.join(root, name), errors="replace") as f:
                text += f"--- {name}\n" + f.read()
    return text


@pytest.mark.msrun
def test_two_hosts_train_like_one_device_and_a_lost_host_stops_the_other(tmp_path):
    reason = namespaces_unavailable()
    if reason is not None:
        pytest.skip(f"two hosts need network namespaces, which cannot be created here: {reason}")
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""), TEST_COMM_TIMEOUT=str(TIMEOUT),
               MSHYPER_JOB_TOKEN=secrets.token_hex(16))
    env.pop("MS_NODE_TIMEOUT", None)
    started = time.monotonic()
    with TwoHosts() as hosts:
        procs = []
        for host in (0, 1):
            out = open(tmp_path / f"msrun{host}.log", "w")
            procs.append(hosts.start(host, [os.path.join(bindir, "msrun"), "--worker_num=4", "--local_worker_num=2",
                                            f"--node_rank={host}", f"--master_addr={hosts.addresses[0]}",
                                            f"--master_port={PORT}", f"--log_dir={tmp_path / f'logs{host}'}",
                                            "--join=True", WORKER, tmp_path], env, out))
        try:
            wait_for(lambda: all((tmp_path / f"rank{r}.json").exists() for r in range(4)), procs, 600,
                     "results from all 4 ranks")
        except BaseException:
            print(logs(tmp_path)[-6000:])
            raise
        results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
        trained_after = time.monotonic() - started

        # killing host 1 stops host 0's job within the timeout, naming a rank of host 1
        killed_at = time.monotonic()
        assert hosts.kill(1) >= 3  # its msrun and two workers
        code = procs[0].wait(timeout=TIMEOUT + 60)
        stopped_after = time.monotonic() - killed_at
        text = logs(tmp_path / "logs0") + (tmp_path / "msrun0.log").read_text()
    print(f"\ntwo hosts: results after {trained_after:.1f} s; host 0's job stopped {stopped_after:.1f} s after host 1 "
          f"was killed (timeout {TIMEOUT} s)")
    assert code != 0 and stopped_after < TIMEOUT + 30, (code, stopped_after)
    named = re.findall(r"The node: (\d+) is timed out|worker (\d+) is the first one timed out", text)
    assert named and {int(a or b) for a, b in named} <= {2, 3}, text[-3000:]

    # every rank's host; ranks of one host share shared memory, the others go through MindSpore
    assert [r["hostname"] for r in results] == ["host0", "host0", "host1", "host1"]
    assert all(r["hosts"][0] == r["hosts"][1] != r["hosts"][2] == r["hosts"][3] for r in results)
    kinds = set()
    for r in results:
        for group, kind in r["groups"].items():
            ranks = [int(x) for x in group.split(",")]
            one_host = len({results[x]["hostname"] for x in ranks}) == 1
            assert kind == ("ShmCommunicator" if one_host else "MindSporeCommunicator"), (group, kind)
            kinds.add(kind)
    assert kinds == {"ShmCommunicator", "MindSporeCommunicator"}

    # the job trained like one device
    trained = held_by_ranks(tmp_path, "trained")
    reference, losses = dense_reference(held_by_ranks(tmp_path, "initial"), 0, len(results[0]["losses"]))
    for r in results:
        np.testing.assert_allclose(r["losses"], list(losses.values()), rtol=TOLERANCE)
    for name, value in reference.items():
        err = np.linalg.norm(trained[name] - value) / max(np.linalg.norm(value), 1e-30)
        assert err <= TOLERANCE, (name, err)

    # the checkpoint committed across both hosts holds what the 4 processes held
    single = dense_stack()
    optimizer = adam(single.trainable_params())
    mh.load_checkpoint(single, tmp_path / "ckpt", optimizer=optimizer)
    loaded = global_values(single, optimizer)
    assert sorted(loaded) == sorted(trained)
    for name, value in trained.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
