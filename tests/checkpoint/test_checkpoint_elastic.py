"""A job that survives, through `mindspore_hyper.launch.run_elastic` (one msrun launch per attempt).

A step saved by 8 simulated devices (data 2 x tensor 4, ZeRO-1 Adam, one step trained) starts a
4-process job (data 2 x tensor 2, ZeRO-1): every process first refuses a copy of it that is
corrupt only for rank 3's regions (changing nothing), then loads it, each process reading only
the checksummed chunks of its regions, with exactly the saved values. The job trains with an
asynchronous save after every step and loses a process at step 3, SIGKILLed while writing its
rank file of that step. The launcher restarts it on 2 processes (data 1 x tensor 2, resized by
`elastic_strategy`), which resume from step 2 -- the newest committed step, loaded with exactly
the values the 4 processes held then; the torn step 3 ignored -- and finish 6 steps with the
losses and parameters of an uninterrupted single-device run from the first step (which needs
the Adam states loaded right). The directory then keeps steps 4-6 (keep_last=3), no leftovers;
the last step loads into one device and into 2 simulated devices (ZeRO-1) with exactly what the
2 processes held, and MindSpore reads each of its per-rank files."""
import json
import os
import shutil

import numpy as np
import pytest
import mindspore as ms

import mindspore_hyper as mh
from mindspore_hyper import auto_parallelize
from mindspore_hyper.checkpoint import Manifest, committed_steps
from mindspore_hyper.checkpoint.directory import leftovers
from mindspore_hyper.launch import run_elastic
from ckpt_models import (adam, assemble, dense_batches, dense_reference, dense_stack, dense_strategy, global_values,
                         simulated_dense, step_dir)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_worker.py")
FIRST, TOTAL, KILL_STEP, KILL_RANK = 1, 6, 3, 2
TOLERANCE = 1e-5
BROKEN_FILE = "rank_7/checkpoint_rank7.safetensors"  # ZeRO-1 states of data 1 x tensor 3: only rank 3 reads it


def start_from_simulation(out):
    """OUT/ckpt: step 1 of 8 simulated devices (one Adam step); OUT/broken: a copy with the header
    of BROKEN_FILE made invalid (its size unchanged); the saved global values."""
    model, par, optimizer = simulated_dense(8, 2, 4, seed=1)
    par.train_step(optimizer, *dense_batches(0, 1)[0])
    mh.save_checkpoint(par, out / "ckpt", optimizer=optimizer, step=FIRST, chunk_bytes=256)
    mh.reset_context()
    values = global_values(model, optimizer)
    np.savez(out / "start_values.npz", **values)
    shutil.copytree(out / "ckpt", out / "broken")
    path = step_dir(out / "broken") / BROKEN_FILE
    data = bytearray(path.read_bytes())
    data[8] = ord("#")
    path.write_bytes(bytes(data))
    return values


def dumped(out, attempt, step, ranks):
    """The global values the ranks of an attempt held at their save of `step`."""
    parts = []
    for r in ranks:
        stem = os.path.join(out, f"a{attempt}_step{step}_rank{r}")
        parts.append((dict(np.load(stem + ".npz")), json.loads(open(stem + ".json").read())))
    return assemble(parts)


def assert_equal_values(actual, expected):
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


@pytest.mark.msrun
def test_a_job_resharded_from_simulation_loses_a_process_and_finishes_like_one_device(tmp_path, clean_context):
    start = start_from_simulation(tmp_path)
    total = sum(e.nbytes for _, e in Manifest.read(str(tmp_path / "ckpt")).tensors())
    result = run_elastic(WORKER, [tmp_path, TOTAL, KILL_STEP, KILL_RANK], nproc=4, nproc_multiple=2, max_restarts=1,
                         log_dir=str(tmp_path / "logs"), attempt_timeout=600)

    # the launcher: a lost process (SIGKILL), then 4 -> 2
    first, second = result.attempts
    assert first.world_size == 4 and first.failure is not None and first.failure.signal == 9, first
    assert second.world_size == 2 and second.returncode == 0 and result.world_size == 2
    records = [json.loads((tmp_path / f"attempt0_rank{r}.json").read_text()) for r in (0, 1, 3)]  # 2 was killed
    resumed = [json.loads((tmp_path / f"attempt1_rank{r}.json").read_text()) for r in range(2)]

    # attempt 0: the broken copy refused by all, nothing changed; the simulated step loaded exactly,
    # each process reading only the chunks of its regions
    for rank, record in zip((0, 1, 3), records):
        refused = record["refused"]
        assert refused["changed"] == [] and refused["message"] is not None, refused
        if rank == 3:
            assert f"{BROKEN_FILE}: corrupt safetensors file" in refused["message"], refused
        else:
            assert "rank(s) [3] failed to read" in refused["message"], refused
        assert record["resumed_from"] == FIRST and record["loaded_error"] == 0.0
        report = record["report"]
        assert report["data_bytes"] == report["needed_bytes"] <= report["read_bytes"] < total / 2, (report, total)

    # attempt 1: resumed from step 2 with exactly what the 4 processes held at their save of step 2
    assert [r["mesh"] for r in resumed] == [[1, 2]] * 2 and {r["resumed_from"] for r in resumed} == {KILL_STEP - 1}
    assert_equal_values(dict(np.load(tmp_path / "resumed.npz")), dumped(tmp_path, 0, KILL_STEP - 1, range(4)))

    # 1 step on 8 simulated devices + 1 on 4 processes + 4 on 2 = 6 uninterrupted steps on one device
    reference, losses = dense_reference(start, FIRST, TOTAL)
    np.testing.assert_allclose([resumed[0]["losses"][str(s)] for s in range(KILL_STEP - 1, TOTAL)],
                               [losses[s] for s in range(KILL_STEP - 1, TOTAL)], rtol=TOLERANCE)
    np.testing.assert_allclose(records[0]["losses"][str(FIRST)], losses[FIRST], rtol=TOLERANCE)
    final = dumped(tmp_path, 1, TOTAL, range(2))
    for name, value in reference.items():
        err = np.linalg.norm(final[name] - value) / max(np.linalg.norm(value), 1e-30)
        assert err <= TOLERANCE, (name, err)

    # the directory: the newest three steps, nothing of the torn save; the last step holds what the 2 held
    root = str(tmp_path / "ckpt")
    assert sorted(committed_steps(root)) == [4, 5, 6] and leftovers(root) == []
    single = dense_stack()
    single_opt = adam(single.trainable_params())
    mh.load_checkpoint(single, root, optimizer=single_opt)
    assert_equal_values(global_values(single, single_opt), final)
    mh.set_context(device_num=2)
    model2 = dense_stack()
    par2 = auto_parallelize(model2, dense_strategy(2, 1))
    opt2 = adam(par2.optimizer_parameters())
    mh.load_checkpoint(par2, root, optimizer=opt2)
    assert_equal_values(global_values(model2, opt2), final)
    manifest = Manifest.read(root)
    for path in manifest.files:
        stored = ms.load_checkpoint(os.path.join(step_dir(root), path), format="safetensors")
        for section, entry in manifest.tensors():
            key = entry.name if section == "parameters" else "opt:" + entry.name
            for shard in (s for s in entry.shards if s.file == path):
                want = final[key][tuple(slice(a, b) for a, b in zip(shard.box.start, shard.box.stop))]
                np.testing.assert_array_equal(stored[shard.key].asnumpy().reshape(want.shape), want)
    kill = json.loads((tmp_path / "kill.json").read_text())["time"]
    print(f"\nelastic restart 4 -> 2: kill -> first step after resume "
          f"{resumed[0]['step_done_at'][str(KILL_STEP - 1)] - kill:.1f} s (attempt 0 {first.ended - first.started:.1f} s,"
          f" attempt 1 {second.ended - second.started:.1f} s)")
