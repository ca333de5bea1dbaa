"""`mindspore-hyper msrun`: msrun's arguments pass through unchanged and the workers start with the
package's interpreter, also from a shell whose PATH finds another `python` (issue 42: the README's
msrun line failed without an activated venv, the workers' log saying No module named 'mindspore_hyper')."""
import os
import subprocess
import sys

import pytest

from cli_run import SCRIPT, cli
from msrun_helpers import free_port

from mindspore_hyper.cli.msrun import msrun_command

BINDIR = os.path.dirname(sys.executable)


def test_arguments_pass_through_and_the_interpreter_comes_first_on_path(monkeypatch):
    started = []
    monkeypatch.setattr(os, "execve", lambda exe, argv, env: started.append((exe, argv, env)))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    args = ["--worker_num=2", "--local_worker_num=2", "--join=True", "train.py", "--help", "-x"]
    code, _, err = cli("msrun", *args)
    assert code == 0, err
    exe, argv, env = started[-1]
    assert exe == os.path.join(BINDIR, "msrun") and argv == [exe, *args]
    assert env["PATH"].split(os.pathsep) == [BINDIR, "/usr/bin", "/bin"]


def test_no_arguments_is_refused_with_an_example():
    code, _, err = cli("msrun")
    assert code == 2 and "give msrun's arguments and the script, e.g. --worker_num=2" in err
    _, argv, env = msrun_command(["s.py"], environ={})
    assert env["PATH"] == BINDIR and argv[1:] == ["s.py"]


@pytest.mark.msrun
def test_workers_import_the_package_from_a_shell_without_the_venv(tmp_path):
    """One worker, a script that needs only the package: started from a PATH without the venv."""
    script = tmp_path / "where.py"
    script.write_text("import sys\nimport mindspore_hyper\nopen(sys.argv[1], 'w').write(sys.executable)\n")
    env = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    out = tmp_path / "worker.txt"
    proc = subprocess.run([SCRIPT, "msrun", "--worker_num=1", "--local_worker_num=1", f"--master_port={free_port()}",
                           f"--log_dir={tmp_path / 'logs'}", "--join=True", str(script), str(out)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert os.path.dirname(out.read_text()) == BINDIR
