"""One msrun job of 4 processes: the HyperParallel API's rank-dependent paths, fully_shard with
each rank's own batch, a distributed checkpoint round trip, meshes smaller than the job, a
pipeline of tensor-parallel stages and the example's tensor-parallel
Llama, launched as a user would (`mindspore-hyper run --processes 4`)."""
import json
import os
import subprocess
import sys

import numpy as np
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
        assert (f"rank {rank}: fully_shard's bfloat16 policy reduces float32 gradients onto float32 pieces like one "
                f"device") in logs
        assert f"rank {rank}: uneven shards (torch.chunk) under msrun equal numpy and one device" in logs
        assert f"rank {rank}: redistribute onto another mesh of the same devices equals numpy and one device" in logs
        assert f"rank {rank}: a rank's empty piece adds zero to sums and runs the backward's collectives" in logs
        assert (f"rank {rank}: fully_shard leaving a rank no rows trains like one device and checkpoints its real "
                f"rows (padded storage)") in logs
        assert f"rank {rank}: fully_shard's (5, 4) and (7, 3) pieces over 4 and 2 are unpadded and equal one" in logs
        assert f"rank {rank}: loss.backward() equals value_and_grad and one device (fully_shard, main_grad, " in logs
        assert f"rank {rank}: Colwise/Rowwise with uneven features train like one device" in logs
        assert f"rank {rank}: distributed checkpoint round trip" in logs
        assert f"rank {rank}: meshes smaller than the job checked" in logs
        assert f"rank {rank}: Parameter(DTensor) of each rank's block trains like one device" in logs
        # issue 41 item 2: clip_grad_norm_ / clip_grads_by_global_norm on each process's pieces
        assert (f"rank {rank}: global-norm clipping counts each piece once (fully_shard, hsdp, Colwise/Rowwise) "
                f"like one device") in logs
        # issue 36: set_requires_gradient_sync / set_requires_grad_sync(False) accumulation, k = 2 and 3
        assert (f"rank {rank}: gradient accumulation without synchronisation (fully_shard, hsdp) equals one "
                f"device") in logs
        assert f"rank {rank}: hsdp(reduce_dtype=float32) sums float16 gradients in float32 (" in logs
        assert f"rank {rank}: tensor-parallel (and GPipe) pipeline 1F1B trains 2 Adam steps like one device" in logs
        assert f"rank {rank}: tensor-parallel (and GPipe) pipeline GPipe equals one device" in logs
        assert f"rank {rank}: fully_shard pipeline 1F1B trains 1 Adam steps like one device" in logs
        assert f"rank {rank}: hsdp pipeline 1F1B trains 1 Adam steps like one device" in logs
        assert f"rank {rank}: hsdp accumulating pipeline 1F1B trains 1 Adam steps like one device" in logs
        # DTensor activations between pipeline ranks: each device's piece to the matching device, layout beside it
        assert f"rank {rank}: Replicate DTensor activations pipeline 1F1B trains 1 Adam steps like one device" in logs
        assert f"rank {rank}: DTensor activations pipeline 1F1B trains 2 Adam steps like one device" in logs
        assert f"rank {rank}: DTensor activations pipeline GPipe equals one device (losses, gradients, an Adam" in logs
        assert f"rank {rank}: DTensor activations (placements {(None, '(Shard(1),)')[rank // 2]}) cross" in logs
        assert f"rank {rank}: local activations pipeline 1F1B trains 1 Adam steps like one device" in logs
        # two stages per pipeline rank; a Partial activation's pieces crossing to a stage with no laid-out
        # Parameter (it takes the sender's mesh moved to its own block)
        assert f"rank {rank}: interleaved DTensor activations pipeline Interleaved1F1B trains 1 Adam steps" in logs
        assert f"rank {rank}: Partial DTensor activations pipeline 1F1B trains 1 Adam steps like one device" in logs
        assert f"rank {rank}: Partial DTensor activations pipeline GPipe equals one device (losses, gradients" in logs
        assert f"rank {rank}: a Partial activation crosses to a stage without a laid-out Parameter like one" in logs
    assert logs.count("OK: tensor-parallel 4 trains like one device over 2 steps") == 4
    # the checkpoint of padded pieces (3 rows saved by 4 processes, rank 3's piece padding only)
    # loads in simulation at 2 devices (pieces 2, 1): the saved values, exact (copied bytes)
    _load_padded_checkpoint_at_two_devices(str(tmp_path / "ckpt") + "_padded")
    # issue 42: the console shows rank 0's report once (every rank's is in the log folder), each
    # worker's lines whole, MindSpore's real warnings, and none of its start-up notices
    console = done.stdout.splitlines()
    assert sum(line.startswith("mindspore-hyper: distributed (rank") for line in console) == 1
    assert "mindspore-hyper: distributed (rank 0), 4 devices" in console
    for rank in range(4):
        own = (tmp_path / "log" / f"report_rank{rank}.txt").read_text()
        assert own.startswith(f"mindspore-hyper: distributed (rank {rank}), 4 devices")
        assert (f"rank {rank}: tensor-parallel (and GPipe) pipeline GPipe equals one device (losses, gradients, an "
                f"Adam step)") in console
        assert any(line.startswith("[WARNING] ME(") and line.endswith(f"rank {rank}: a real MindSpore warning reaches "
                                                                         "the console") for line in console)
    from mindspore_hyper.launch.worker_console import is_harmless

    assert not [line for line in console + done.stderr.splitlines() if is_harmless(line)]
    logged = "".join((tmp_path / "log" / f"worker_{r}.log").read_text() for r in range(4)).splitlines()
    assert sum(is_harmless(line) for line in logged) >= 4 * 5  # the logs keep them (5 a worker at least)
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
    # each process's step memory series (every op, phase and live byte count, the peak and its
    # op) equals a simulated device's for the same script: the styles' local outputs are
    # rank-local DTensors in both modes, so the attention's ops on them are accounted in both
    simulated = tmp_path / "simulated.json"
    done = subprocess.run([cli, "run", "--devices", "4", "--json", str(simulated),
                           os.path.join(EXAMPLES, "hyper_parallel_llama.py"), "--tp", "4", "--steps", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    sim_mesh = [m for m in json.loads(simulated.read_text())["meshes"] if m["dim_names"] == ["tp"]][0]
    assert sim_mesh["step_memory"]["timeline"] and sim_mesh["step_memory"]["per_device"][0]["step_peak"] > 0
    for report in per_rank:
        mesh = [m for m in report["meshes"] if m["dim_names"] == ["tp"] and m["shape"] == [4]][0]
        assert mesh["step_memory"] == sim_mesh["step_memory"]


def _load_padded_checkpoint_at_two_devices(path):
    import mindspore_hyper as mh
    from mindspore import nn
    from mindspore_hyper.hyper_parallel import init_device_mesh, laid_out_parameters
    from mindspore_hyper.hyper_parallel.fully_shard import fully_shard

    mh.set_context(device_num=2)
    narrow = nn.Dense(8, 3)
    fully_shard(narrow, mesh=init_device_mesh("npu", (2,), mesh_dim_names=("dp",)))
    mh.load_checkpoint(narrow, path)
    saved = np.load(path + "_values.npz")  # rank 0's gathered pieces at the save
    for name, value in laid_out_parameters(narrow).items():
        assert value.to_local().local_shard(1).shape[0] == 1  # 3 rows over 2 devices: 2, 1
        np.testing.assert_array_equal(value.full_tensor().asnumpy(), saved[name], err_msg=name)


@pytest.mark.msrun
def test_a_failing_rank_ends_the_job_with_its_error_and_leaves_nothing_behind(tmp_path):
    """A pipeline rank that dies before run() (raises while building its stage) while its peer runs the
    step: the console ends the job at once with that rank's error (launch/rank_failure.py), not at a
    timeout (the peer's comm_timeout, or msrun's scheduler noticing the dead worker's heartbeat)."""
    script = tmp_path / "fails.py"
    script.write_text(
        "import numpy as np\nfrom mindspore import Tensor, nn\n"
        "from mindspore.communication.management import get_rank, init\n"
        "from hyper_parallel import PipelineStage, Schedule1F1B\n"
        "init()\n"
        "if get_rank() == 1:\n    raise RuntimeError('rank 1 fails on purpose while building its stage')\n"
        "stage = PipelineStage(nn.Dense(4, 4), 0, 2)\n"
        "Schedule1F1B(stage, 2).run(Tensor(np.ones((4, 4), np.float32)))  # waits for rank 1\n")
    before = set(os.listdir("/dev/shm"))
    cli = os.path.join(os.path.dirname(sys.executable), "mindspore-hyper")
    env = dict(os.environ, MS_HYPER_COMM_TIMEOUT="200")  # a timeout would not end the job before the test's
    try:
        done = subprocess.run([cli, "run", "--processes", "2", "--log-dir", str(tmp_path / "log"), str(script)],
                              env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("a failing rank did not end the job within 240 s (hang)")
    assert done.returncode != 0 and "worker_*.log" in done.stderr
    # ended by the console on rank 1's own report, naming its error
    assert ("mindspore-hyper run: rank 1 failed: RuntimeError: rank 1 fails on purpose while building its stage; "
            "the job was ended at once") in done.stderr, done.stderr[-3000:]
    logs = worker_logs(tmp_path / "log", 2)
    assert "rank 1 fails on purpose" in logs  # its traceback, printed before the job was ended
    # not by a timeout: rank 0 was stopped while waiting, msrun's scheduler did not time the dead worker out
    for text in (logs, done.stdout, done.stderr):
        assert "CommTimeout" not in text and "timed out node" not in text
    left = {n for n in set(os.listdir("/dev/shm")) - before if n.startswith("mshyper")}
    assert not left, f"shared-memory segments left behind: {left}"
    stray = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert not stray, f"processes of the job still running: {stray}"
