"""The elastic launcher's decisions, with msrun replaced by a scripted runner (the real msrun
path is tests/checkpoint/test_checkpoint_elastic.py): a worker killed by a signal shrinks the
job to the largest allowed size left, any other failure restarts it on the same size, a worker
refusing the world size or too few processes left end it; strategies resize their data axis
and refuse, by name, what cannot be resized."""
import os

import pytest

from mindspore_hyper import Layout
from mindspore_hyper.launch import (EXIT_CANNOT_RESIZE, CannotResize, ElasticError, elastic_strategy, next_world_size,
                                    resize_data_axis, run_elastic)


class ScriptedMsrun:
    """Plays msrun: each attempt exits with the next scripted code (0, or a failing worker's code)."""

    def __init__(self, codes):
        self.codes = list(codes)
        self.calls = []

    def __call__(self, args, env, log_dir):
        self.calls.append((args, env["MSHYPER_ELASTIC_ATTEMPT"]))
        code = self.codes.pop(0)
        if code == 0:
            return 0, "All workers successfully exit!"
        return 1, f"[ERROR] ME(1:1,MainProcess):... Worker process {4000 + len(self.calls)} exit with exception. " \
                  f"Error code: {code}.\nRuntimeError: Distributed job exited with exception."


def workers(runner):
    return [int(next(a for a in args if a.startswith("--worker_num=")).split("=")[1]) for args, _ in runner.calls]


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("")
    return str(path)


def test_lost_processes_shrink_the_job_and_other_failures_restart_it(script, tmp_path):
    runner = ScriptedMsrun([-9, 1, -9, 0])  # SIGKILL, a Python error, SIGKILL, done
    lines = []
    result = run_elastic(script, ["--steps", 6], nproc=8, nproc_multiple=2, max_restarts=3, log_dir=str(tmp_path),
                         runner=runner, log=lines.append)
    assert workers(runner) == [8, 6, 6, 4] and result.world_size == 4
    assert [a.failure.code if a.failure else None for a in result.attempts] == [-9, 1, -9, None]
    assert [attempt for _, attempt in runner.calls] == ["0", "1", "2", "3"]
    args = runner.calls[0][0]
    assert args[-3:] == [script, "--steps", "6"] and "--join=True" in args
    assert f"--log_dir={os.path.join(str(tmp_path), 'attempt_0')}" in args
    assert "worker pid 4001 was killed by signal 9 (SIGKILL) (a lost process); restarting on 6 processes" in lines[1]
    assert "worker pid 4002 exited with code 1; restarting on 6 processes" in lines[3]


def test_the_job_ends_when_too_few_processes_remain_or_a_worker_refuses(script, tmp_path):
    with pytest.raises(ElasticError, match="1 process\\(es\\) remain, fewer than the job needs .* a multiple of 2"):
        run_elastic(script, nproc=2, nproc_multiple=2, log_dir=str(tmp_path), runner=ScriptedMsrun([-9]), log=print)
    runner = ScriptedMsrun([-9, EXIT_CANNOT_RESIZE])
    with pytest.raises(ElasticError, match="a worker cannot run on 3 processes .* not restarted") as info:
        run_elastic(script, nproc=4, log_dir=str(tmp_path), runner=runner, log=print)
    assert [a.world_size for a in info.value.attempts] == [4, 3]
    with pytest.raises(ElasticError, match="the job failed 2 times \\(max_restarts=1\\)"):
        run_elastic(script, nproc=4, max_restarts=1, log_dir=str(tmp_path), runner=ScriptedMsrun([1, 1]), log=print)


def test_bad_arguments_are_named(script, tmp_path):
    for kwargs, expected in (({"nproc": 0}, "nproc: expected an int >= 1, got 0"),
                             ({"nproc": 4, "nproc_multiple": 3}, "nproc=4: expected a multiple of nproc_multiple=3"),
                             ({"nproc": 2, "min_nproc": 3}, "at least min_nproc=3"),
                             ({"nproc": 2, "max_restarts": -1}, "max_restarts: expected an int >= 0")):
        with pytest.raises(ValueError, match=expected):
            run_elastic(script, log_dir=str(tmp_path), runner=ScriptedMsrun([0]), **kwargs)
    with pytest.raises(ValueError, match="script: .* is not a file"):
        run_elastic(str(tmp_path / "missing.py"), nproc=1, log_dir=str(tmp_path), runner=ScriptedMsrun([0]))


def test_next_world_size():
    assert next_world_size(4, 1) == 3 and next_world_size(4, 1, multiple=2) == 2
    assert next_world_size(8, 3, min_nproc=4, multiple=4) == 4 and next_world_size(8, 5, min_nproc=4, multiple=4) is None
    assert next_world_size(1, 1) is None


def megatron_like(data, tensor):
    s = Layout((data, tensor), ("data", "tensor"))(tensor_map=(), optimizer_state="data")
    return s.override("*.0.*", "tensor").override("*.3.weight", None, "tensor")


def test_a_strategy_resizes_its_data_axis_and_keeps_the_rest():
    s = megatron_like(2, 2)
    smaller = resize_data_axis(s, 2, batch_size=8)
    assert smaller.mesh.device_matrix == (1, 2) and smaller.mesh.alias_names == ("data", "tensor")
    assert smaller.overrides == s.overrides and smaller.optimizer_state == "data" and smaller.data_axis == "data"
    assert resize_data_axis(s, 8).mesh.device_matrix == (4, 2)
    assert resize_data_axis(s, 4) is s


def test_what_cannot_be_resized_is_refused_by_name(monkeypatch):
    s = megatron_like(2, 2)
    with pytest.raises(CannotResize, match="3 devices cannot run the strategy: the axes kept \\(tensor=2\\) need a "
                                           "multiple of 2; only the 'data' axis \\(2\\) can shrink"):
        resize_data_axis(s, 3)
    with pytest.raises(CannotResize, match="the global batch 6 does not divide over data=4"):
        resize_data_axis(s, 8, batch_size=6)
    no_data = Layout((2, 2), ("x", "tensor"))(tensor_map=())
    with pytest.raises(CannotResize, match="has no data axis: it cannot be resized from 4 to 2 devices"):
        resize_data_axis(no_data, 2)
    with pytest.raises(CannotResize, match="strategy: expected a Strategy .* got dict"):
        resize_data_axis({}, 2)
    with pytest.raises(CannotResize, match="world_size: expected an int >= 1, got 0"):
        resize_data_axis(s, 0)
    # worker side: outside the launcher a refusal raises; under it, the job ends with EXIT_CANNOT_RESIZE
    monkeypatch.setenv("MS_WORKER_NUM", "3")
    monkeypatch.delenv("MSHYPER_ELASTIC_ATTEMPT", raising=False)
    with pytest.raises(CannotResize):
        elastic_strategy(s)
    monkeypatch.setenv("MSHYPER_ELASTIC_ATTEMPT", "1")
    with pytest.raises(SystemExit) as info:
        elastic_strategy(s)
    assert info.value.code == EXIT_CANNOT_RESIZE
    monkeypatch.setenv("MS_WORKER_NUM", "2")
    assert elastic_strategy(s).mesh.device_matrix == (1, 2)


def test_the_elastic_command_passes_its_flags(script, tmp_path, monkeypatch, capsys):
    import mindspore_hyper.launch as launch
    from mindspore_hyper.cli import main

    seen = {}

    def fake_run_elastic(script_path, args, **kwargs):
        seen.update(kwargs, script=script_path, args=args)
        return run_elastic(script_path, args, runner=ScriptedMsrun([-9, 0]), log=print, **kwargs)

    monkeypatch.setattr(launch, "run_elastic", fake_run_elastic)
    assert main(["elastic", "--nproc", "4", "--nproc-multiple", "2", "--log-dir", str(tmp_path), script,
                 "--ckpt", "c"]) == 0
    assert seen["args"] == ["--ckpt", "c"] and seen["nproc"] == 4 and seen["nproc_multiple"] == 2
    assert "finished after 2 attempt(s) on 4 -> 2 processes" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["elastic", "--nproc", "0", "--log-dir", str(tmp_path), script])
    assert info.value.code == 2
