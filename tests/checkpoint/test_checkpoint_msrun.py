"""Round trips through a distributed job: a simulated 8-device checkpoint (data 2 x tensor 4,
ZeRO-1) loads into 4 msrun processes (data 2 x tensor 2, ZeRO-1), each reading only its
regions' bytes; they train on and save; that checkpoint loads into one device and into a
2-device simulation (ZeRO-1) with the values the processes held, and MindSpore reads every
per-rank file. A checkpoint corrupt for one process only is refused by all, changing nothing."""
import json
import os
import shutil

import numpy as np
import pytest
import mindspore as ms

import mindspore_hyper as mh
from mindspore_hyper import auto_parallelize
from mindspore_hyper.checkpoint import Manifest
from ckpt_models import adam, batches, global_values, gpt, megatron
from msrun_helpers import run_msrun, worker_logs

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt_worker.py")
WORKERS = 4


def saved_by_simulation(tmp_path):
    """Two Adam steps on 8 simulated devices, saved with the optimizer; the global values."""
    mh.set_context(device_num=8)
    ms.set_seed(1)
    model = gpt()
    par = auto_parallelize(model, megatron(2, 4, zero=True))
    optimizer = adam(par.optimizer_parameters())
    for batch in batches(0, 2):
        par.train_step(optimizer, *batch)
    mh.save_checkpoint(par, tmp_path / "sim8", optimizer=optimizer)
    values = global_values(model, optimizer)
    np.savez(tmp_path / "sim8_values.npz", **values)
    return values


def break_for_rank3(tmp_path):
    """OUT/broken: OUT/sim8 with the header of the file only process 3 reads (simulated rank 7:
    ZeRO-1 states of data 1 x tensor 3) made invalid, its size unchanged."""
    shutil.copytree(tmp_path / "sim8", tmp_path / "broken")
    path = tmp_path / "broken" / "rank_7" / "checkpoint_rank7.safetensors"
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[8] = ord("#")
    path.write_bytes(bytes(data))


def held_by_processes(tmp_path):
    """The global arrays the 4 processes held after saving, put together from their regions."""
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORKERS)]
    values = {}
    for r, result in enumerate(results):
        held = np.load(tmp_path / f"held_rank{r}.npz")
        for name, region in result["regions"].items():
            shape = [b for _, b in region]
            full = values.setdefault(name, np.full(shape, np.nan, held[name].dtype)
                                     if held[name].dtype.kind == "f" else np.zeros(shape, held[name].dtype))
            if full.shape != tuple(shape):  # a region of a larger tensor: grow to its end
                grown = np.full(np.maximum(full.shape, shape), np.nan, full.dtype)
                grown[tuple(slice(0, n) for n in full.shape)] = full
                full = values[name] = grown
            full[tuple(slice(a, b) for a, b in region)] = held[name]
    return results, values


def assert_equal_values(actual, expected):
    assert sorted(actual) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


@pytest.mark.msrun
def test_sim8_to_distributed4_to_single_device_and_sim2(tmp_path, clean_context):
    sim8 = saved_by_simulation(tmp_path)
    break_for_rank3(tmp_path)
    proc = run_msrun(WORKER, [tmp_path], WORKERS, tmp_path / "logs", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(tmp_path / "logs", WORKERS)
    results, held = held_by_processes(tmp_path)
    assert not any(np.isnan(v).any() for v in held.values() if v.dtype.kind == "f")  # the regions tile

    # a file only rank 3 needs is corrupt: every rank refuses the load and changes nothing
    for result in results:
        refused = result["refused"]
        assert refused["changed"] == [] and refused["message"] is not None
        if result["rank"] == 3:
            assert "rank_7/checkpoint_rank7.safetensors: corrupt safetensors file" in refused["message"]
        else:
            assert "rank(s) [3] failed to read" in refused["message"] and "nothing was loaded" in refused["message"]

    stored = Manifest.read(str(tmp_path / "sim8"))
    total = sum(e.nbytes for _, e in stored.tensors())
    for result in results:
        # the sim8 values arrived exactly; each process read only its regions' bytes
        assert result["loaded_error"] == 0.0
        report = result["report"]
        assert report["data_bytes"] == report["needed_bytes"] < total / 2, (report, total)

    # one device: the distributed checkpoint holds exactly what the processes held
    single, single_opt = gpt(), None
    single_opt = adam(single.trainable_params())
    mh.load_checkpoint(single, tmp_path / "dist4", optimizer=single_opt)
    assert_equal_values(global_values(single, single_opt), held)

    # continuing the sim8 run on one device gives the processes' losses and values (so their
    # ZeRO-1 slices of the Adam states were loaded right)
    ref, ref_opt = gpt(), None
    ref_opt = adam(ref.trainable_params())
    mh.load_checkpoint(ref, tmp_path / "sim8", optimizer=ref_opt)
    assert_equal_values(global_values(ref, ref_opt), sim8)
    step = ms.value_and_grad(ref, None, ref_opt.parameters)
    losses = []
    for batch in batches(2, 2):
        loss, grads = step(*batch)
        ref_opt(grads)
        losses.append(float(loss.asnumpy()))
    np.testing.assert_allclose(results[0]["losses"], losses, rtol=1e-5)
    continued = global_values(ref, ref_opt)
    for name, value in held.items():
        if value.dtype.kind == "f" and value.size > 1 and "qkv.bias" not in name:  # (key bias: see dist tests)
            assert np.linalg.norm(value - continued[name]) <= 1e-4 * np.linalg.norm(continued[name]) + 1e-7, name

    # dist(4) -> sim(2) with ZeRO-1 on its data axis
    mh.set_context(device_num=2)
    model2 = gpt()
    par2 = auto_parallelize(model2, megatron(2, 1, zero=True))
    opt2 = adam(par2.optimizer_parameters())
    mh.load_checkpoint(par2, tmp_path / "dist4", optimizer=opt2)
    assert_equal_values(global_values(model2, opt2), held)

    # MindSpore reads every per-rank file; each holds the manifest's regions of the held values
    manifest = Manifest.read(str(tmp_path / "dist4"))
    assert manifest.mode == "distributed" and manifest.mesh.device_matrix == (2, 2)
    for path in manifest.files:
        stored_file = ms.load_checkpoint(str(tmp_path / "dist4" / path), format="safetensors")
        for section, entry in manifest.tensors():
            key = entry.name if section == "parameters" else "opt:" + entry.name
            for shard in entry.shards:
                if shard.file == path:
                    want = held[key][tuple(slice(a, b) for a, b in zip(shard.box.start, shard.box.stop))]
                    np.testing.assert_array_equal(stored_file[shard.key].asnumpy().reshape(want.shape), want)
