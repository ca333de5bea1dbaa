"""Another local user can neither join nor block a job (issue 23): a temporary system user,
created for the test and removed even on failure, plays the attacker from a process of its own
uid (the system python, standard library only, an empty environment).

Before our job, it pre-creates, mode 0666, every segment name it can derive from what it knows
(the group's name, the names older versions used); while our group forms, it sees the segment
in /dev/shm but can open it neither for writing nor for reading, nor read our process's
environment (where the job token is); our group forms and computes exactly. Even a segment name
it learned (passed to it here) does not let it in: our ranks refuse its segment."""
import json
import os
import pwd
import shutil
import subprocess
import textwrap
import uuid

import numpy as np
import pytest
from comm_helpers import on_both_ranks
from shm_raw import forming_group

from mindspore_hyper.comm import CommError, ShmCommunicator

ATTACKER = textwrap.dedent("""
    import json, os, sys
    task = json.loads(sys.argv[1])
    report = {}
    if task["step"] == "precreate":
        for name in task["names"]:
            try:
                fd = os.open("/dev/shm/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
                os.fchmod(fd, 0o666)
                os.ftruncate(fd, task["bytes"])
                os.close(fd)
                report[name] = "created"
            except OSError as exc:
                report[name] = type(exc).__name__
    else:  # "probe": the job's segment is in /dev/shm now
        seen = [n for n in os.listdir("/dev/shm") if n.startswith(task["prefix"])]
        report["seen"] = seen
        for name in seen:
            for mode, flags in (("rw", os.O_RDWR), ("ro", os.O_RDONLY)):
                try:
                    os.close(os.open("/dev/shm/" + name, flags))
                    report[name + ":" + mode] = "opened"
                except OSError as exc:
                    report[name + ":" + mode] = type(exc).__name__
        try:
            with open("/proc/%d/environ" % task["pid"], "rb") as f:
                report["environ"] = "read" if b"MSHYPER_JOB_TOKEN" in f.read() else "no token"
        except OSError as exc:
            report["environ"] = type(exc).__name__
    print(json.dumps(report))
""")


def _system_python() -> str:
    for path in ("/usr/bin/python3", "/bin/python3", "/usr/local/bin/python3"):
        if os.access(path, os.X_OK):
            return path
    return ""


@pytest.fixture
def other_user():
    """A fresh system user (name, uid, gid), removed with whatever it left in /dev/shm."""
    missing = [tool for tool in ("useradd", "userdel") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing or not _system_python():
        reason = ("not root" if os.geteuid() != 0 else f"no {', '.join(missing)}" if missing
                  else "no system python3 another user may run")
        print(f"SKIP two-user test: {reason}")
        pytest.skip(f"a second user cannot be created here: {reason}")
    name = "mshyt" + uuid.uuid4().hex[:8]
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True)
    try:
        pw = pwd.getpwnam(name)
        yield pw
    finally:
        try:
            for entry in os.listdir("/dev/shm"):
                path = "/dev/shm/" + entry
                if os.stat(path).st_uid == pw.pw_uid:
                    os.unlink(path)
        finally:
            subprocess.run(["userdel", name], check=False, capture_output=True)


def _as(user, task: dict) -> dict:
    proc = subprocess.run([_system_python(), "-I", "-c", ATTACKER, json.dumps(task)], user=user.pw_uid,
                          group=user.pw_gid, extra_groups=[], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_another_user_can_neither_join_nor_block_a_job(other_user):
    name = "j" + uuid.uuid4().hex[:12]
    layout_bytes = 3648 + 4 * (192 + 4096)
    # what it can derive without the token: the group's name as the segment name (older
    # versions), and the readable part of today's names with any suffix
    guesses = [f"mshyper_{name}", f"mshyper_{name}_0", f"mshyper_{name}_" + "0" * 32]
    created = _as(other_user, {"step": "precreate", "names": guesses, "bytes": layout_bytes})
    assert set(created.values()) == {"created"}, created

    thread, done, raw = forming_group(name)  # our rank 0 creates the segment despite the squatted names
    probe = _as(other_user, {"step": "probe", "prefix": f"mshyper_{name}", "pid": os.getpid()})
    ours = os.path.basename(raw.path)
    assert ours in probe["seen"] and ours not in guesses
    assert probe[ours + ":rw"] == "PermissionError" and probe[ours + ":ro"] == "PermissionError"
    assert probe["environ"] == "PermissionError"  # the token cannot be read
    g1 = ShmCommunicator(name, 1, 2, timeout=10.0, channel_bytes=4096)
    thread.join(30)
    g0 = done[0]
    assert isinstance(g0, ShmCommunicator), g0
    sums = on_both_ranks([g0, g1], lambda g: g.all_reduce(np.full(4, g.rank + 1.0, np.float32)))
    for s in sums:
        np.testing.assert_array_equal(s, np.full(4, 3.0, np.float32))
    for g in (g0, g1):
        g.close()
    raw.close()

    # a name it learned (here: told) still does not let it in, nor makes our rank 0 use its segment
    from comm_helpers import segment_path

    leaked = segment_path(name + "x")[len("/dev/shm/"):]
    assert _as(other_user, {"step": "precreate", "names": [leaked], "bytes": layout_bytes}) == {leaked: "created"}
    with pytest.raises(CommError, match=rf"not this user's private segment \(owner uid {other_user.pw_uid}"):
        ShmCommunicator(name + "x", 1, 2, timeout=5.0, channel_bytes=4096)
    with pytest.raises(CommError, match=rf"already exists and is owned by uid {other_user.pw_uid}"):
        ShmCommunicator(name + "x", 0, 2, timeout=5.0, channel_bytes=4096)
