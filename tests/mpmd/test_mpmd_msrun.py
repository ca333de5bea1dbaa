"""MPMD groups under msrun: each process runs its group, cross-group tensors over shared memory;
training equals one device, also with global-norm clipping and loss scaling over the groups and
through torch-style `loss.backward()`;
groups reading only the batch do not wait for each other; a dead peer is named by the survivors."""
import json
import os

import pytest

from msrun_helpers import run_msrun, worker_logs
from tolerances import U32, training_rtol

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpmd_worker.py")


@pytest.mark.msrun
def test_groups_on_4_processes_train_like_one_device(mpmd_4_processes):
    """The job is shared with test_rlhf_msrun.py (conftest.py's `mpmd_4_processes`)."""
    results = mpmd_4_processes["train"]
    expected_members = [["text_encoder"], ["text_encoder"], ["vision_encoder"], ["fusion_layer"]]
    for rank, res in enumerate(results):
        assert res["members"] == expected_members[rank]
        assert all(name.startswith(expected_members[rank][0] + ".") for name in res["params"]) and res["params"]
        assert res["losses"] == pytest.approx(res["ref_losses"], rel=1e-5)
        for what in ("grad_error", "param_error"):
            assert set(res[what]) == set(res["params"])
            for name, err in res[what].items():
                assert err < 1e-5, (rank, what, name, err)
        # the StepReport of a process: its own rank, holding its group's parameters (data parallel: whole)
        assert res["report_ranks"] == [rank] and res["report_parameters"] == res["param_bytes"]
        assert res["report_groups"] == ["fusion_layer", "text_encoder", "vision_encoder"]
        # the global norm's float64 sum over the 4 processes: 8 bytes in, the ring's 2(n-1)/n x 8 = 12 sent
        assert res["norm_rows"] == [[{"count": 1, "bytes": 12, "input_bytes": 8}, {"grad norm": 1}]]
        # only members ran the group's Cells; the others received the outputs
        assert {e[0] for e in res["events"] if e[1] == "forward"} == set(expected_members[rank])
        assert {e[0] for e in res["events"] if e[1] == "receive"} == \
            {"text_encoder", "vision_encoder", "fusion_layer"} - set(expected_members[rank])

    def last(rank, kind, group):
        return max(e[3] for e in results[rank]["events"] if e[1] == kind and e[0] == group)

    # train_step(max_grad_norm=, loss_scale=): the norm over the 4 processes' groups (one all-gather),
    # the same on every process, equals one device's; clipping was active; the groups' parameters
    # equal one device's with ops.clip_by_global_norm, within the float32 bound of another reduction
    # order (tests/tolerances.py)
    first = results[0]
    rtol = training_rtol(first["clip_reduction"], len(first["clip_norms"]))
    for rank, res in enumerate(results):
        assert res["clip_norms"] == first["clip_norms"] and not res["clip_skipped"]
        assert res["clip_norms"] == pytest.approx(res["clip_ref_norms"], rel=rtol)
        assert res["clip_losses"] == pytest.approx(res["clip_ref_losses"], rel=rtol)
        assert set(res["clip_param_error"]) == set(res["params"])
        for name, err in res["clip_param_error"].items():
            bound = rtol * res["clip_param_moved"][name] + 4 * U32 * res["clip_param_norm"][name]
            assert err <= bound, (rank, name, err, bound)
    assert first["clip_ref_norms"][0] > first["clip_max_norm"]

    # 2 Adam steps as `loss.backward(); model.optimizer_step(opt)` (mpmd_worker.backward_training): the
    # same ops as train_step's value_and_grad in the same order, so bit for bit its losses, first
    # gradients and parameters, and one device's within float32 rounding (mpmd_models.assert_same_training)
    for rank, res in enumerate(results):
        assert res["backward_params"] == res["params"], rank
        assert res["backward_differs_from_train_step"] == [], (rank, res["backward_differs_from_train_step"])
        assert res["backward_vs_one_device"] == "ok", (rank, res["backward_vs_one_device"])

    # after the first step the encoders, which read only the batch, run before waiting for each
    # other's output: text (ranks 0-1) and vision (rank 2) compute at the same time
    assert last(0, "forward", "text_encoder") < last(0, "receive", "vision_encoder")
    assert last(2, "forward", "vision_encoder") < last(2, "receive", "text_encoder")


@pytest.mark.msrun
def test_a_dead_group_peer_is_named(tmp_path):
    env = dict(os.environ, TEST_COMM_TIMEOUT="20")
    proc = run_msrun(WORKER, [tmp_path, "fail@0"], 4, tmp_path / "logs", timeout=300, env=env)
    assert proc.returncode != 0
    fusion = json.loads((tmp_path / "fail_rank3.json").read_text())  # waits for the text output
    assert fusion["error"] == "CommTimeout", fusion
    assert "rank 0" in fusion["message"] and "text_encoder" in fusion["message"], fusion["message"]
    assert fusion["seconds"] < 20
    assert "rank 0 fails on purpose" in worker_logs(tmp_path / "logs", 4)
