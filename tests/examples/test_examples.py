"""The examples run on CPU and pass their own checks against single-device/resident runs."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from paths import REPO_ROOT

ROOT = str(REPO_ROOT)


@pytest.mark.parametrize("script,expect", [
    ("quickstart.py", "OK: 3 steps on data 2 x tensor 2 x pipeline 2 (8 simulated devices) match one device"),
    ("train_transformer.py", "OK: 5 steps match single-device training"),
    ("offload_training.py", "OK: offloaded training matches resident training"),
    # 16 offloaded layers x 2 steps: the property (each simulated device's store holding 4x its
    # tier budget, losses equal resident training) does not need the default 32 x 5
    ("offload_training.py --simulate --layers 16 --steps 2", "OK: offloaded training matches resident training"),
    # the README's hint for a shorter run (issue 42: it crashed with a StoreError, the device tier
    # sized below one cache block)
    ("offload_training.py --simulate --layers 2 --steps 2", "OK: offloaded training matches resident training"),
    ("mpmd_multimodal.py --steps 2", "OK: 2 steps on the seed's device groups match one device"),
    ("rlhf_ppo.py --steps 1", "OK: 1 PPO steps on device groups match the roles run one after another"),
])
def test_example_runs_and_checks_itself(script, expect):
    result = subprocess.run([sys.executable, *os.path.join(ROOT, "examples", script).split()], capture_output=True,
                            text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert expect in result.stdout
    if script == "quickstart.py":  # `make demo`: no MindSpore warning or error line (issue 42)
        noise = [line for line in result.stderr.splitlines() if line.startswith(("[WARNING]", "[ERROR]"))]
        assert not noise, "\n".join(noise)


@pytest.mark.msrun
def test_train_transformer_example_under_msrun(tmp_path):
    """The README's msrun command: the same script, one process per device."""
    from msrun_helpers import run_msrun, worker_logs

    env = dict(os.environ, MS_HYPER_MODE="distributed")
    proc = run_msrun(os.path.join(ROOT, "examples", "train_transformer.py"), [], 2, tmp_path / "logs", 600, env=env)
    logs = worker_logs(tmp_path / "logs", 2, tail=100000)
    assert proc.returncode == 0, proc.stderr[-2000:] + logs
    assert logs.count("OK: 5 steps match single-device training") == 2, logs[-3000:]
    assert "mode distributed, 2 devices, this process holds [0]" in logs


def _worktree_env(**extra):
    """The environment with this checkout first on PYTHONPATH (the venv may hold another copy)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), **extra)


def test_pipeline_example_in_simulation():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "pipeline_training.py")],
                            capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env=_worktree_env(PIPELINE_SCHEDULE="zb_h1"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "OK: 5 pipelined steps match single-device training" in result.stdout
    assert "schedule zb_h1, mesh {'data': 2, 'pipeline': 2}" in result.stdout


@pytest.mark.msrun
def test_pipeline_example_under_msrun(tmp_path):
    """The docstring's msrun command: one process per pipeline rank."""
    from msrun_helpers import run_msrun, worker_logs

    env = _worktree_env(MS_HYPER_MODE="distributed")
    proc = run_msrun(os.path.join(ROOT, "examples", "pipeline_training.py"), [], 2, tmp_path / "logs", 300, env=env)
    logs = worker_logs(tmp_path / "logs", 2, tail=100000)
    assert proc.returncode == 0, proc.stderr[-2000:] + logs
    assert logs.count("OK: 5 pipelined steps match single-device training") == 2, logs[-3000:]
    assert "this process runs stages [0]" in logs and "this process runs stages [1]" in logs


def test_pretrain_llama_checks_itself_and_resumes_at_another_size(tmp_path):
    """The pre-training example (clipping 1.0, 4 accumulated micro-batches, ZeRO-1, the sharded
    loader, checkpoints, telemetry) matches one device over its steps, and its checkpoint of step 2
    on 4 devices, resumed on 2, continues the loss curve of the uninterrupted run (the run that
    checks itself also saves: one run fewer, the killed-and-resumed run is tests/resume_smoke.py's)."""
    from mindspore_hyper.checkpoint.directory import step_name

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from pretrain_llama import loss_rtol

    script = os.path.join(ROOT, "examples", "pretrain_llama.py")
    tokens = str(tmp_path / "tokens.bin")

    def run(*args):
        done = subprocess.run([sys.executable, script, "--tokens", tokens, "--log-every", "1", *args],
                              capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        return done.stdout, done.stderr

    def logged(stderr):
        """The telemetry's lines (`step N | loss X.XXXX | ...`): {step: loss}."""
        found = re.findall(r"^step (\d+) \| loss (\S+) \| grad_norm (\S+)", stderr, re.MULTILINE)
        assert all(float(norm) > 0 for _, _, norm in found), found  # clipping's global norm, logged each step
        return {int(step): float(loss) for step, loss, _ in found}

    out, err = run("--steps", "4", "--ckpt", str(tmp_path / "ckpt"), "--save-every", "2")
    assert "OK: 4 steps on 4 devices match one device" in out
    whole = [float(x) for x in out.split("parallel losses:")[1].splitlines()[0].split()]
    one_device = [float(x) for x in out.split("one-device losses:")[1].splitlines()[0].split()]
    # the telemetry logs the global loss of each step: one device's within the example's derived
    # bound, plus half a unit of the 4 logged and 7 printed decimals
    rtol4 = np.asarray(loss_rtol("fp32", 4, batch=16, tensor=2))
    steps = logged(err)
    assert sorted(steps) == [0, 1, 2, 3], err[-3000:]
    assert (np.abs(np.subtract([steps[i] for i in range(4)], one_device))
            <= rtol4 * np.abs(one_device) + 0.5e-4 + 0.5e-7).all(), (steps, one_device)
    resumed, err = run("--steps", "2", "--devices", "2", "--resume", str(tmp_path / "ckpt" / step_name(2)), "--no-check")
    tail = [float(x) for x in resumed.split("parallel losses:")[1].splitlines()[0].split()]
    assert sorted(logged(err)) == [2, 3], err[-3000:]  # numbered from the run's start: steps 3 and 4
    # steps 3-4 on 2 devices from the checkpoint: the same data (the loader's position), weights
    # and optimizer states as the uninterrupted run's; only float32 summation order differs (data
    # 1 instead of 2): the example's loss_rtol derives the bound of the s-th step after the restore
    # (4 s gamma_512: 1.2e-4, 2.4e-4), plus 1e-7 for the 7 printed decimals
    rtol = loss_rtol("fp32", 2, batch=16)
    assert (np.abs(np.subtract(tail, whole[2:])) <= rtol * np.abs(whole[2:]) + 1e-7).all(), (tail, whole[2:], rtol)
