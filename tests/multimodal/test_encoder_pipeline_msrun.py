"""AsyncEncoderPipeline under msrun: two encoder processes and an LM process give the per-request
outputs and the training gradients/parameters of the single-process synchronous model (inference
and training in one 3-process job: a launch costs every process's MindSpore start-up)."""
import json
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mm_models import direct_outputs, loss_fn, make_batches, make_models
from msrun_helpers import run_msrun, worker_logs

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mm_worker.py")


def launch(tmp_path, workers, runs, timeout=300, **env):
    """mm_worker.py's `runs` ("<infer|train|fail>:<ahead>") in one job of `workers` processes."""
    return run_msrun(WORKER, [tmp_path, *runs], workers, tmp_path / "logs", timeout * len(runs),
                     env=dict(os.environ, MS_HYPER_MODE="distributed", **env))


@pytest.fixture(scope="module")
def three_processes(tmp_path_factory):
    """Inference (ahead 2) and training (ahead 1) on 2 encoder processes and the LM process."""
    folder = tmp_path_factory.mktemp("mm_3_processes")
    proc = launch(folder, 3, ["infer:2", "train:1"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(folder / "logs", 3)
    return {what: [(dict(np.load(folder / what / f"rank{r}.npz")),
                    json.loads((folder / what / f"rank{r}.json").read_text())) for r in range(3)]
            for what in ("infer", "train")}


@pytest.mark.msrun
def test_inference_on_two_encoder_processes_and_one_lm_process(three_processes):
    ranks = three_processes["infer"]
    assert [meta["role"] for _, meta in ranks] == ["encoder", "encoder", "lm"]
    assert not ranks[0][0] and not ranks[1][0]  # outputs live on the LM process
    outputs, meta = ranks[2]
    encoder, lm = make_models(seed=3)
    batches = make_batches(6, seed=1, labels=False, duplicates_of={4: 0})
    for b in batches:
        expected = direct_outputs(encoder, lm, b)
        for i, rid in enumerate(b.request_ids):
            np.testing.assert_allclose(outputs[f"out{rid}"], expected[i], rtol=1e-5, atol=1e-6)
    # batch 4 repeats batch 0's images; both are encoded by encoder 0, whose cache answers them
    assert meta["reused"] == {"8": 0, "9": 1}
    assert meta["stats"]["hits"] == 2 and meta["stats"]["misses"] == 10
    assert sorted(meta["consume"]) == list(range(6))
    groups = {g for g, *_ in meta["events"]}
    assert groups == {"encoder0", "encoder1", "lm"}
    # back-pressure across processes: an encoder starts its k-th batch only after the LM took its
    # (k - ahead)-th (ahead = 2; the LM records its start before it sends TAKEN)
    lm_start = {b: s for g, k, b, s, e in meta["events"] if g == "lm"}
    for enc in ("encoder0", "encoder1"):
        starts = sorted((s, b) for g, k, b, s, e in meta["events"] if g == enc and k == "encode")
        for k in range(2, len(starts)):
            assert starts[k][0] >= lm_start[starts[k - 2][1]]


@pytest.mark.msrun
def test_training_matches_the_synchronous_single_process_model(three_processes):
    ranks = three_processes["train"]  # 2 encoder replicas (gradients all-reduced) + the LM
    encoder, lm = make_models(seed=3)
    batches = make_batches(5, seed=1)
    params = encoder.trainable_params() + lm.trainable_params()
    opt = nn.SGD(params, learning_rate=0.1)
    ref_losses = []
    for step in range(2):
        def total(*_):
            losses = [loss_fn(lm(encoder(ms.Tensor(b.images)), ms.Tensor(b.text)), ms.Tensor(b.labels))
                      for b in batches]
            return sum(losses[1:], losses[0]), losses

        (loss, per_batch), grads = ms.value_and_grad(total, grad_position=None, weights=params, has_aux=True)()
        ref_losses.append([float(l.asnumpy()) for l in per_batch])
        if step == 0:
            first = {p.name: g.asnumpy() for p, g in zip(params, grads)}
        opt(grads)
    enc_out, enc_meta = ranks[0]
    lm_out, lm_meta = ranks[2]
    assert [meta["role"] for _, meta in ranks] == ["encoder", "encoder", "lm"]
    assert enc_out.keys() == ranks[1][0].keys()
    for key in enc_out:  # both replicas hold the summed gradient and so the same parameters
        np.testing.assert_array_equal(enc_out[key], ranks[1][0][key])
    for step in range(2):
        got = [lm_meta["losses"][step][str(b)] for b in range(5)]
        np.testing.assert_allclose(got, ref_losses[step], rtol=1e-5)
    held = {**enc_out, **lm_out}
    assert {k[5:] for k in held if k.startswith("grad:")} == {p.name for p in params}
    for p in params:
        np.testing.assert_allclose(held["grad:" + p.name], first[p.name], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(held["param:" + p.name], p.asnumpy(), rtol=1e-4, atol=1e-6)
    kinds = {(g, k) for g, k, *_ in lm_meta["events"]}
    assert {("encoder0", "encoder_backward"), ("encoder1", "encoder_backward"), ("lm", "lm")} <= kinds


@pytest.mark.msrun
def test_a_failing_encoder_process_fails_the_lm_instead_of_hanging(tmp_path):
    proc = launch(tmp_path, 2, ["fail:1"], timeout=120, MS_HYPER_COMM_TIMEOUT="30")
    assert proc.returncode != 0
    logs = worker_logs(tmp_path / "logs", 2, tail=100000)
    assert "encoder failure injected by the test" in logs
    lm_log = logs[logs.index("--- worker 1"):]
    assert "CommTimeout: encoder pipeline: receiving on world ranks 0 -> 1" in lm_log, lm_log[-3000:]
    assert "died" in lm_log
