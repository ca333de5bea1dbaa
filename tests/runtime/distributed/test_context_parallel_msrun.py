"""Context parallelism under msrun: the examples' GPT (causal mask) and a TransformerEncoderLayer
classifier (padding mask) on cp 2 (2 processes), data 2 x cp 2 and cp 4 (4 processes) equal one device
(forward, first-step gradients, 5 momentum steps). Ring attention runs its hand-written backward
ring with asynchronous shifts in both passes (timed per pass), the zigzag order and block skipping
for the causal mask (every process computes the same, reduced, number of blocks, forward and
backward); Ulysses (AllToAll) on the GPT; the cp traffic is reported forward and backward;
`loss.backward()` gives `value_and_grad`'s gradients."""
import json
import os

import numpy as np
import pytest

from msrun_helpers import run_msrun, worker_logs

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cp_worker.py")
KINDS = {"ring": "P2P", "ulysses": "AllToAll"}
CAUSAL_BLOCKS = 5  # of the 4 x 4 chunk blocks (zigzag over cp 2) the 10 causal ones, half per process
PADDED_BLOCKS = 4  # of a process's 8 blocks, those of key chunks 2 and 3 (positions 8-15) are all padding


def _run(tmp_path, workers: int, cases):
    """case ("<model>-<method>@<data>x<cp>", see cp_worker.py) -> each rank's results."""
    proc = run_msrun(WORKER, [tmp_path, *cases], workers, tmp_path / "logs", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(tmp_path / "logs", workers)
    return {case: [json.loads((tmp_path / f"{case}-rank{r}.json").read_text()) for r in range(workers)]
            for case in cases}


@pytest.fixture(scope="module")
def four_processes(tmp_path_factory):
    """The data 2 x cp 2 and cp 4 cases in one 4-process job (a launch costs 4 MindSpore start-ups)."""
    return _run(tmp_path_factory.mktemp("cp_4_processes"), 4,
                ["gpt-ring@2x2", "encoder-ring@2x2", "gpt-ulysses@2x2", "gpt-ring@1x4"])


def _check_like_one_device(case, ranks):
    for rank, result in enumerate(ranks):
        assert result["rank"] == rank
        np.testing.assert_allclose(result["losses"], result["ref_losses"], rtol=1e-5, err_msg=case)
        assert result["forward_error"] <= 1e-5, case
        assert result["grad_error"] <= 1e-5, case
        assert result["param_error"] <= 1e-5, case
        assert result["backward_error"] == 0.0, case  # loss.backward(): value_and_grad's ops, in its order
        kind = KINDS[case.split("@")[0].split("-")[1]]
        assert result["comm"][kind]["cp"]["bytes"] > 0 and result["comm_backward"][kind]["cp"]["bytes"] > 0, case


def _check_ring(case, ranks, cp: int):
    """Both passes' shifts were asynchronous and timed: per layer n-1 K/V shifts forward; backward
    n posted shifts (the first with K/V only, the middle ones K/V with the accumulators, the last
    the accumulators only) and the one that brings the accumulators home; the recorded P2P bytes are the timed shifts' plus, in
    zigzag order, the chunk exchange; every block computed forward is recomputed backward."""
    for result in ranks:
        rings = len(result["blocks"])
        assert rings == 1, case  # one attention layer
        assert result["timed_shifts"] == {"forward": (cp - 1) * rings, "backward": (cp + 1) * rings}, case
        for phase, comm in (("forward", result["comm"]), ("backward", result["comm_backward"])):
            recorded, timed = comm["P2P"]["cp"]["bytes"], result["timed_bytes"][phase]
            assert recorded > timed if any(result["zigzag"]) else recorded == timed, (case, phase)
        for blocks in result["blocks"]:
            assert blocks["forward"] == blocks["backward"], case


@pytest.mark.msrun
def test_ring_gpt_and_encoder_on_cp2_processes(tmp_path):
    results = _run(tmp_path, 2, ["gpt-ring@1x2", "encoder-ring@1x2"])
    for case, ranks in results.items():
        _check_like_one_device(case, ranks)
        _check_ring(case, ranks, 2)
    for case in results:  # causal GPT: zigzag + skipping; the lone encoder sequence is padded from 5 on
        assert all(r["zigzag"] == [True] for r in results[case]), case
    assert [r["blocks"][0]["forward"][0] for r in results["gpt-ring@1x2"]] == [CAUSAL_BLOCKS] * 2
    assert [r["blocks"][0]["forward"][0] for r in results["encoder-ring@1x2"]] == [PADDED_BLOCKS] * 2


@pytest.mark.msrun
def test_ring_and_ulysses_on_data2_x_cp2_processes(four_processes):
    results = {case: ranks for case, ranks in four_processes.items() if case.endswith("@2x2")}
    assert len(results) == 3
    for case, ranks in results.items():
        _check_like_one_device(case, ranks)
    for case in ("gpt-ring@2x2", "encoder-ring@2x2"):
        _check_ring(case, results[case], 2)
    assert [r["blocks"][0]["forward"][0] for r in results["gpt-ring@2x2"]] == [CAUSAL_BLOCKS] * 4
    # data group 0 holds the padded sequence (zigzag, its padded key blocks skipped), group 1 not
    assert [r["zigzag"] for r in results["encoder-ring@2x2"]] == [[True], [True], [False], [False]]
    assert [r["blocks"][0]["forward"][0] for r in results["encoder-ring@2x2"]] == [PADDED_BLOCKS] * 2 + [2, 2]


@pytest.mark.msrun
def test_ring_gpt_on_cp4_processes(four_processes):
    """One ring of 4 processes: 3 K/V shifts forward, 5 backward; zigzag over 8 chunks gives each
    process 9 of the 36 causal blocks (in the job of the data 2 x cp 2 cases, after them)."""
    ranks = four_processes["gpt-ring@1x4"]
    _check_like_one_device("gpt-ring@1x4", ranks)
    _check_ring("gpt-ring@1x4", ranks, 4)
    assert all(r["zigzag"] == [True] for r in ranks)
    assert [r["blocks"][0]["forward"][0] for r in ranks] == [9] * 4
