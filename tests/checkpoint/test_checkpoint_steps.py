"""Checkpoint steps: numbered step directories, the newest committed one loaded (or step=N, or a
step directory itself), keep_last retention, a step not newer than the committed ones refused,
leftovers of unfinished saves ignored by loads and removed by the next save."""
import json

import numpy as np
import pytest
from mindspore import Tensor

import mindspore_hyper as mh
from mindspore_hyper.checkpoint import CheckpointError, committed_steps, newest_step
from mindspore_hyper.checkpoint.directory import leftovers
from ckpt_models import dense_stack, global_values


def saved_states(root, count, **kwargs):
    """`count` saves of a model whose weights change between them: the values of each."""
    model = dense_stack()
    values = []
    for i in range(count):
        for p in model.trainable_params():
            p.set_data(Tensor(np.full(p.shape, float(i), np.float32)))
        mh.save_checkpoint(model, root, **kwargs)
        values.append(global_values(model))
    return values


def loads(root, **kwargs):
    model = dense_stack()
    report = mh.load_checkpoint(model, root, **kwargs)
    return report, global_values(model)


def test_steps_are_numbered_and_the_newest_loads(tmp_path):
    values = saved_states(tmp_path, 3)
    assert sorted(committed_steps(str(tmp_path))) == [0, 1, 2] and newest_step(str(tmp_path)) == 2
    report, got = loads(tmp_path)
    assert report.step == 2 and report.path == str(tmp_path / "step_000002")
    np.testing.assert_array_equal(got["_backbone.0.weight"], values[2]["_backbone.0.weight"])
    report, got = loads(tmp_path, step=1)
    np.testing.assert_array_equal(got["_backbone.3.bias"], values[1]["_backbone.3.bias"])
    report, got = loads(tmp_path / "step_000000")  # a step directory itself
    assert report.step == 0
    np.testing.assert_array_equal(got["_backbone.3.bias"], values[0]["_backbone.3.bias"])
    with pytest.raises(CheckpointError, match=r"step 7 is not committed; committed steps: \[0, 1, 2\]"):
        loads(tmp_path, step=7)
    with pytest.raises(CheckpointError, match="is the committed step 0, not step=1"):
        loads(tmp_path / "step_000000", step=1)


def test_keep_last_keeps_the_newest_steps(tmp_path):
    saved_states(tmp_path, 4, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002", "step_000003"]


def test_a_step_not_newer_than_the_committed_ones_is_refused(tmp_path):
    model = dense_stack()
    mh.save_checkpoint(model, tmp_path, step=5)
    for step in (5, 3):
        with pytest.raises(CheckpointError, match=f"step {step} is not newer than the newest committed step 5"):
            mh.save_checkpoint(model, tmp_path, step=step)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000005"]
    assert mh.save_checkpoint(model, tmp_path).step == 6


def test_leftovers_are_ignored_then_removed_by_the_next_save(tmp_path):
    values = saved_states(tmp_path, 1)
    # an unfinished save of a newer step, its markers, a step directory without commit record
    # (e.g. copied by hand), half-deleted retention
    junk = [".tmp-step_000004-0123abcd", ".tmp-step_000004-0123abcd.markers", "step_000003",
            ".trash-step_000000-99aa"]
    for name in junk:
        (tmp_path / name / "rank_0").mkdir(parents=True)
        (tmp_path / name / "manifest.json").write_text("{}")
    assert leftovers(str(tmp_path)) == sorted(junk)
    report, got = loads(tmp_path)
    assert report.step == 0
    np.testing.assert_array_equal(got["_backbone.0.weight"], values[0]["_backbone.0.weight"])
    manifest = mh.save_checkpoint(dense_stack(), tmp_path)
    assert manifest.step == 1 and leftovers(str(tmp_path)) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000000", "step_000001"]


def test_no_committed_step_is_explained(tmp_path):
    (tmp_path / ".tmp-step_000000-ab12").mkdir()
    with pytest.raises(CheckpointError, match=r"holds no committed checkpoint \(ignored, not committed: "
                                              r"\['.tmp-step_000000-ab12'\]\)"):
        loads(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "mindspore_hyper.checkpoint", "version": 1}))
    with pytest.raises(CheckpointError, match="a checkpoint of format version 1"):
        loads(tmp_path)
