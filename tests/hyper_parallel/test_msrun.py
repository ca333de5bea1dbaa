"""One msrun job of 4 processes: the HyperParallel API's rank-dependent paths, fully_shard with
each rank's own batch, a distributed checkpoint round trip, meshes smaller than the job, a
pipeline of tensor-parallel stages and the example's tensor-parallel
Llama, launched as a user would (`mindspore-hyper run --processes 4`)."""
import json
import os
import subprocess
import sys

import pytest

from msrun_helpers import worker_logs
from paths import EXAMPLES

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.msrun
def test_rank_dependent_api_and_the_example_under_msrun(tmp_path):
    cli = os.path.join(os.path.dirname(sys.executable), "mindspore-hyper")
    env = dict(os.environ, HP_EXAMPLES=str(EXAMPLES), HP_CKPT=str(tmp_path / "ckpt"))
    report = tmp_path / "report.json"
    try:
        done = subprocess.run([cli, "run", "--processes", "4", "--log-dir", str(tmp_path / "log"), "--json", str(report),
                               os.path.join(HERE, "rank_checks.py")], env=env, capture_output=True, text=True,
                              timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("msrun did not finish within 300 s (hang)")
    logs = worker_logs(tmp_path / "log", 4, tail=60000)  # every check's line, before the long report
    assert done.returncode == 0, done.stderr[-2000:] + logs[-8000:]
    for rank in range(4):
        assert f"rank {rank}: rank-dependent API checks passed" in logs
        assert f"rank {rank}: ContextParallel (Ulysses and gathered k/v) equals one device" in logs
        assert f"rank {rank}: fully_shard with per-rank batches trains like one device" in logs
        assert f"rank {rank}: fully_shard's main_grad holds this rank's piece of one device's gradient" in logs
        assert f"rank {rank}: uneven shards (torch.chunk) under msrun equal numpy and one device" in logs
        assert f"rank {rank}: redistribute onto another mesh of the same devices equals numpy and one device" in logs
        assert f"rank {rank}: a rank's empty piece adds zero to sums and runs the backward's collectives" in logs
        assert f"rank {rank}: fully_shard leaving a rank no rows and loss.backward() are refused, named" in logs
        assert f"rank {rank}: Colwise/Rowwise with uneven features train like one device" in logs
        assert f"rank {rank}: distributed checkpoint round trip" in logs
        assert f"rank {rank}: meshes smaller than the job checked" in logs
        assert f"rank {rank}: Parameter(DTensor) of each rank's block trains like one device" in logs
        assert f"rank {rank}: tensor-parallel (and GPipe) pipeline 1F1B trains 2 Adam steps like one device" in logs
        assert f"rank {rank}: tensor-parallel (and GPipe) pipeline GPipe equals one device" in logs
        assert f"rank {rank}: fully_shard pipeline 1F1B trains 1 Adam steps like one device" in logs
        assert f"rank {rank}: hsdp pipeline 1F1B trains 1 Adam steps like one device" in logs
        assert f"rank {rank}: hsdp accumulating pipeline 1F1B trains 1 Adam steps like one device" in logs
    assert logs.count("OK: tensor-parallel 4 trains like one device over 2 steps") == 4
    per_rank = [json.loads((tmp_path / f"report.json.rank{r}").read_text()) for r in range(4)]
    assert [r["mode"] for r in per_rank] == [f"distributed (rank {r})" for r in range(4)]
    # the tiled 2-device mesh of ranks 2 and 3 counts only those two devices in their reports
    assert any(m["ranks"] == [2, 3] and m["shape"] == [2] for m in per_rank[3]["meshes"] if "ranks" in m)
    tp_mesh = [m for m in per_rank[0]["meshes"] if m["dim_names"] == ["tp"] and m["shape"] == [4]][0]
    assert any(row["kind"] == "AllReduce" and row["axis"] == "tp" for row in tp_mesh["collectives"])
    # the example's Llama (vocab 64, dim 32, hidden 64, 2 layers), tensor 4, float32: every
    # matrix of the plan split 4 ways (its norms are plain Parameters, outside the plan)
    matrices = 64 * 32 * 2 + 2 * (4 * 32 * 32 + 3 * 32 * 64)
    assert tp_mesh["parameter_bytes_per_device"] == 4 * (matrices // 4)


@pytest.mark.msrun
def test_a_failing_rank_ends_the_job_with_its_error_and_leaves_nothing_behind(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(
        "import numpy as np\nfrom mindspore import Tensor\nfrom hyper_parallel import init_device_mesh, DTensor\n"
        "from hyper_parallel.core.dtensor.placement_types import Shard\n"
        "mesh = init_device_mesh('cpu', (2,), mesh_dim_names=('dp',))\n"
        "if mesh.get_rank() == 1:\n    raise RuntimeError('rank 1 fails on purpose')\n"
        "print(DTensor.from_local(Tensor(np.ones(2, np.float32)), mesh, [Shard(0)]).full_tensor())\n")
    before = set(os.listdir("/dev/shm"))
    cli = os.path.join(os.path.dirname(sys.executable), "mindspore-hyper")
    env = dict(os.environ, MS_HYPER_COMM_TIMEOUT="20")
    try:
        done = subprocess.run([cli, "run", "--processes", "2", "--log-dir", str(tmp_path / "log"), str(script)],
                              env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("a failing rank did not end the job within 240 s (hang)")
    assert done.returncode != 0 and "worker_*.log" in done.stderr
    assert "rank 1 fails on purpose" in worker_logs(tmp_path / "log", 2)
    left = {n for n in set(os.listdir("/dev/shm")) - before if n.startswith("mshyper")}
    assert not left, f"shared-memory segments left behind: {left}"
    stray = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert not stray, f"processes of the job still running: {stray}"
