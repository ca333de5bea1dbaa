"""Distributed mode under msrun: the example GPT trained on 2 and 4 processes equals the same
GPT trained on one device (losses, gradients, parameters after 3 Adam steps), with and without
ZeRO-1; each process holds only its shards; a failing rank makes the others fail with
CommTimeout naming it, msrun exits non-zero and no shared memory is left behind."""
import glob
import json
import os
import sys

import numpy as np
import pytest

from mindspore_hyper.runtime.distributed.cpu_binding import cores_for
from msrun_helpers import run_msrun, worker_logs

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_worker.py")
TOLERANCE = 1e-5


def run(tmp_path, workers, cases, timeout=900, env=None):
    proc = run_msrun(WORKER, [tmp_path, *cases], workers, tmp_path / "logs", timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(tmp_path / "logs", workers)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(workers)]


def relative(errors, name):
    _, diff, norm = errors[name]
    return diff / max(norm, 1e-30)


def check_matches_single_device(result):
    np.testing.assert_allclose(result["losses"], result["ref_losses"], rtol=TOLERANCE)
    for what in ("grad_error", "param_error"):
        errors = result[what]
        for name in errors:
            if name.endswith("[key]"):
                # attention key bias: its exact gradient is 0 (softmax ignores a shift of all
                # scores), so Adam's m/sqrt(v) turns rounding noise into steps of the learning
                # rate's size in both runs; only the absolute error is meaningful there
                assert errors[name][0] < 1e-3 * 5 if what == "param_error" else errors[name][0] < 1e-6, (what, name)
                continue
            assert relative(errors, name) <= TOLERANCE, (what, name, errors[name])
        total = sum(e[1] ** 2 for e in errors.values()) ** 0.5 / sum(e[2] ** 2 for e in errors.values()) ** 0.5
        assert total <= TOLERANCE, (what, total)


def simulated_step(data: int, tensor: int, zero: bool = False) -> dict:
    """The worker's GPT, strategy and first batch, one train_step simulated in this process: its
    report's figures that a distributed rank's must equal (JSON-shaped, as the worker writes them):
    what caused each collective, and the step's memory series (every step has the same shapes, so
    the worker's last step has the first step's series)."""
    import importlib.util

    import mindspore_hyper as mh
    from mindspore import nn

    spec = importlib.util.spec_from_file_location("dist_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    mh.set_context(mode="simulation", device_num=data * tensor)
    model = mh.auto_parallelize(worker.GPT(vocab=128, hidden=64, heads=worker.HEADS, layers=2, seq=16),
                                worker.megatron(data, tensor, zero))
    optimizer = nn.Adam(model.optimizer_parameters(), learning_rate=1e-3)
    model.train_step(optimizer, *worker.batches(1)[0])
    report = model.report(optimizer)
    return json.loads(json.dumps({"comm_causes": report.comm_causes, "step_memory": report.step_memory}))


def check_step_memory_like_simulation(result: dict, simulated: dict, rank: int) -> None:
    """A process's step memory series (forward, backward, update) equals the simulation's of the
    same step byte for byte: the series, its peak's phase and op, exact and rounded, and this
    rank's step peaks (the process reports its own device only)."""
    step, expected = result["step_memory"], simulated["step_memory"]
    assert step is not None and step["timeline"], "a training step's report has a memory series"
    assert {k: v for k, v in step.items() if k != "per_device"} == \
        {k: v for k, v in expected.items() if k != "per_device"}
    assert step["per_device"] == {str(rank): expected["per_device"][str(rank)]}


def check_causes_like_simulation(result: dict, simulated: dict) -> None:
    """Every collective names what caused it: each cause the simulation of the same step names, with
    the same count, and each row's causes add up to its count. The backward of an all-reduce by max
    (cross-entropy's logsumexp) moves the winners' counts under msrun, where the simulation records
    nothing: extra backward AllReduces over 'tensor', named after the op input they are for."""
    causes = result["comm_causes"]
    for phase, kinds in simulated.items():
        for kind, axes in kinds.items():
            for axis, row in axes.items():
                for cause, count in row.items():
                    assert causes[phase][kind][axis].get(cause) == count, (phase, kind, axis, cause)
    for kind, axes in result["comm_backward"].items():
        for axis, row in axes.items():
            assert sum(causes["backward"][kind][axis].values()) == row["count"], (kind, axis)
            extra = set(causes["backward"][kind][axis]) - set(simulated["backward"].get(kind, {}).get(axis, {}))
            assert not extra or (kind, axis) == ("AllReduce", "tensor") and all(
                c.startswith("redistribute for ") for c in extra), (kind, axis, extra)


@pytest.mark.msrun
def test_gpt_data_x_tensor_with_and_without_zero1_on_4_processes(dist_4_processes):
    """The job is shared with test_train_options_msrun.py (conftest.py's `dist_4_processes`)."""
    results = dist_4_processes
    simulated, simulated_zero = simulated_step(2, 2), simulated_step(2, 2, zero=True)
    causes = [c for kinds in simulated["comm_causes"].values() for axes in kinds.values() for row in axes.values()
              for c in row]
    assert all(causes) and any(c.startswith("grad sync of ") for c in causes)  # each attributed, grad syncs named
    for rank, res in enumerate(results):
        plain, zero = res["2x2"], res["2x2+zero"]
        assert plain["rank"] == rank
        check_matches_single_device(plain)
        check_matches_single_device(zero)
        # a process holds its shards: parameters, gradients and (unless ZeRO-1) Adam's two states
        assert plain["memory"]["parameters"] == plain["param_bytes_held"] < plain["global_param_bytes"]
        assert plain["memory"]["optimizer_states"] == plain["optimizer_bytes_held"] == 2 * plain["param_bytes_held"]
        # ZeRO-1 over data=2: each process keeps half of its shards' optimizer states
        assert zero["memory"]["optimizer_states"] == zero["optimizer_bytes_held"] == zero["param_bytes_held"]
        assert "ReduceScatter" in zero["comm_backward"] and "AllGather" in zero["comm_backward"]
        assert "AllReduce" in plain["comm_backward"]
        check_causes_like_simulation(plain, simulated["comm_causes"])
        check_step_memory_like_simulation(plain, simulated, rank)
        check_step_memory_like_simulation(zero, simulated_zero, rank)
        assert any(c.startswith("optimizer ZeRO gather of ") for c in zero["comm_causes"]["backward"]["AllGather"]["data"])
        assert plain["communicators"] == ["ShmCommunicator"]
        # cpu_binding="auto": each process on its own cores, every thread with it
        expected = cores_for(rank, 4, sorted(os.sched_getaffinity(0)))
        if len(os.sched_getaffinity(0)) < os.cpu_count():  # this test runs bound already: left as it is
            assert plain["cores"] is None
        else:
            assert plain["cores"] == sorted(expected) and plain["thread_cores"] == [sorted(expected)], plain


@pytest.mark.msrun
def test_gpt_tensor_parallel_and_data_parallel_zero1_on_2_processes(tmp_path):
    results = run(tmp_path, 2, ["1x2", "2x1+zero"])
    for res in results:
        check_matches_single_device(res["1x2"])
        check_matches_single_device(res["2x1+zero"])
        # nn.Adam(net.trainable_params()) with ZeRO-1: refused on first use, naming the fix
        # (it would keep full-size states while the report printed the sharded figure)
        assert res["1x2"]["misuse"] == [None, None]  # no ZeRO-1: the full shards are what it needs
        for message, where in zip(res["2x1+zero"]["misuse"], ("report", "train_step")):
            assert message.startswith(f"{where}: the optimizer was built on the model's full parameters"), message
            assert "nn.Adam(parallel_model.optimizer_parameters()" in message
        assert "'embed.embedding_table': shape (128, 64) here, its slice (64, 64)" in res["2x1+zero"]["misuse"][0]


@pytest.mark.msrun
def test_mindspore_transport_with_process_groups_on_4_processes(tmp_path):
    """dist_transport="mindspore" (the several-hosts path: mindspore.communication.init() and
    mint.distributed over new_group groups) gives the same training as the shared-memory one,
    with and without ZeRO-1; every MindSpore collective is called from the main thread (the
    data-parallel sync's packets included: sent from a background thread beside the backward's
    tensor-parallel all-reduce, they made MindSpore fail with "AllReduce failed"). A bfloat16 step
    with the CPU emulation equals the one-device emulated step within the bound derived in
    tests/runtime/bfloat16_msrun_case.py (its tensor-parallel forward runs in Cells of
    mixed-precision type BF16, where MindSpore's collectives left each rank's input unreduced
    before the transport launched them uncast)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/runtime
    from bfloat16_msrun_case import check

    env = dict(os.environ, MS_HYPER_DIST_TRANSPORT="mindspore")
    for rank, res in enumerate(run(tmp_path, 4, ["2x2+zero", "2x2", "bf16"], env=env)):
        for case in ("2x2+zero", "2x2"):
            check_matches_single_device(res[case])
            assert res[case]["communicators"] == ["MindSporeCommunicator"]
            assert res[case]["collective_threads"] == ["MainThread"], res[case]["collective_threads"]
        check(res["bf16"], f"rank {rank}, dist_transport='mindspore'")


@pytest.mark.msrun
def test_a_failing_rank_makes_the_others_fail_naming_it(tmp_path):
    before = set(glob.glob("/dev/shm/mshyper_*"))
    env = dict(os.environ, TEST_COMM_TIMEOUT="30")
    proc = run_msrun(WORKER, [tmp_path, "fail@1"], 2, tmp_path / "logs", timeout=300, env=env)
    assert proc.returncode != 0
    survivor = json.loads((tmp_path / "fail_rank0.json").read_text())
    assert survivor["error"] == "CommTimeout", survivor
    assert "rank 1" in survivor["message"], survivor["message"]
    assert survivor["seconds"] < 30, survivor
    assert not (tmp_path / "fail_rank1.json").exists()
    assert "rank 1 fails on purpose" in worker_logs(tmp_path / "logs", 2)
    assert set(glob.glob("/dev/shm/mshyper_*")) <= before
