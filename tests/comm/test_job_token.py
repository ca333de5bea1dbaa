"""The job token (mindspore_hyper/comm/job_token.py): inherited through the environment, shared
under msrun by a rendezvous file private to the user, malformed values named. The module uses the
standard library only, so the processes here load it by path (no MindSpore import: fast)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from mindspore_hyper.comm import job_token as jt
from mindspore_hyper.comm.shm import segment_name

MODULE = jt.__file__


def _spawn(env: dict, code: str) -> subprocess.Popen:
    script = textwrap.dedent(f"""
        import importlib.util, json, os, sys
        spec = importlib.util.spec_from_file_location("job_token", {MODULE!r})
        jt = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(jt)
    """) + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _msrun_env(tmp_path, rank: int) -> dict:
    """A worker's environment as msrun makes it on a second host: local rank `rank`, global rank + 2."""
    env = {k: v for k, v in os.environ.items() if k != jt.ENV}
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env.update(MS_ROLE="MS_WORKER", RANK_ID=str(rank + 2), DEVICE_ID=str(rank), XDG_RUNTIME_DIR=str(runtime))
    return env


def test_this_process_has_a_token_its_children_inherit():
    token = os.environ[jt.ENV]  # set when mindspore_hyper.comm was imported
    assert jt.job_token() == token and len(token) == 32
    child = _spawn(dict(os.environ), "print(jt.job_token())")
    assert child.communicate(timeout=60)[0].strip() == token


def test_msrun_ranks_share_a_token_through_a_private_rendezvous_file(tmp_path):
    # local rank 1 first: it waits for local rank 0's file; both are children of this process,
    # like msrun's workers; global ranks 2 and 3 (a second host's) publish for their own host.
    # Each waits for a line on stdin before exiting: rank 0 must outlive rank 1's read, as under msrun
    # (its file is removed at its exit)
    code = """
        token = jt.job_token(timeout=30)
        directory = jt.token_dir()
        files = [f for f in os.listdir(directory) if f.endswith(".token")]
        st = os.stat(os.path.join(directory, files[0])) if files else None
        print(json.dumps({"token": token, "env": os.environ[jt.ENV], "files": files,
                          "mode": st and oct(st.st_mode & 0o777), "dir_mode": oct(os.stat(directory).st_mode & 0o777)}),
              flush=True)
        sys.stdin.readline()
    """
    rank1 = _spawn(_msrun_env(tmp_path, 1), code)
    rank0 = _spawn(_msrun_env(tmp_path, 0), code)
    out1, err1 = rank1.communicate(input="exit\n", timeout=60)
    out0, err0 = rank0.communicate(input="exit\n", timeout=60)
    assert rank0.returncode == 0 and rank1.returncode == 0, err0 + err1
    r0, r1 = json.loads(out0), json.loads(out1)
    assert r0["token"] == r1["token"] == r0["env"] and len(r0["token"]) == 32
    assert r0["mode"] == "0o600" and r0["dir_mode"] == "0o700"
    assert r0["files"][0].split("_")[-2] == str(os.getpid())  # named by the launcher (the common parent)
    directory = tmp_path / "run" / "mindspore_hyper"
    assert list(directory.iterdir()) == []  # rank 0 removed it at exit


def test_a_rank_without_rank_0_times_out_naming_the_file(tmp_path):
    rank1 = _spawn(_msrun_env(tmp_path, 1), """
        try:
            jt.job_token(timeout=0.2)
        except TimeoutError as exc:
            print("TIMEOUT", exc)
    """)
    out, err = rank1.communicate(timeout=60)
    assert "TIMEOUT local rank 1: local rank 0 did not publish the job token in " in out, err
    assert ".token within 0.2 s" in out


def test_a_rendezvous_directory_others_may_enter_is_not_used(tmp_path):
    env = _msrun_env(tmp_path, 0)
    env["HOME"] = str(tmp_path / "home")
    os.chmod(env["XDG_RUNTIME_DIR"], 0o777)  # not private: skipped for the one under HOME
    child = _spawn(env, "print(jt.token_dir())")
    out, err = child.communicate(timeout=60)
    assert out.strip() == str(tmp_path / "home" / ".cache" / "mindspore_hyper" / "run"), err


def test_a_malformed_token_is_named(monkeypatch):
    monkeypatch.setenv(jt.ENV, "not-hex")
    with pytest.raises(ValueError, match="MSHYPER_JOB_TOKEN: the job token must be 32 to 128 lowercase hex digits"):
        jt.job_token()


def test_segment_names_depend_on_the_token_and_the_whole_name():
    a, b = "0" * 32, "1" * 32
    assert segment_name("g", a) != segment_name("g", b)
    assert segment_name("x" * 40 + "1", a) != segment_name("x" * 40 + "2", a)
    assert segment_name("a/b c", a).startswith("mshyper_a_b_c_") and len(segment_name("y" * 999, a)) == 73
