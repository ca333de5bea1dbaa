"""The converted Cell in the train/eval mode torch was not traced in (issue 38): a forward that branches on
`self.training` is refused in the other mode (in memory and in the written file), with the fix in the message;
dropout and BatchNorm modules, which follow set_train, run in both modes as torch does."""
import copy
import importlib.util
import json
import os

import numpy as np
import pytest
import torch
import mindspore as ms
from mindspore import nn

from mindspore_hyper.migrate import MigrationError, convert
from mindspore_hyper.migrate.mode_check import refuse_mode

from migrate_models import TOL, assert_same_outputs

pytestmark = pytest.mark.usefixtures("pynative")

STRUCTURES = ("modules", "flat")


class TrainOnlyTanh(torch.nn.Module):
    """tanh in training only: the traced program keeps the branch torch took."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)
        return torch.tanh(h) if self.training else h


class NormDropout(torch.nn.Module):
    """BatchNorm and Dropout modules only: both follow Cell.set_train, no branch of its own."""

    def __init__(self, p: float):
        super().__init__()
        self.fc = torch.nn.Linear(4, 6)
        self.norm = torch.nn.BatchNorm1d(6)
        self.drop = torch.nn.Dropout(p)
        with torch.no_grad():  # statistics far from the batch's, so train and eval outputs differ
            self.norm.running_mean.copy_(torch.linspace(-1.0, 1.0, 6))
            self.norm.running_var.copy_(torch.linspace(0.5, 2.0, 6))

    def forward(self, x):
        return self.drop(self.norm(self.fc(x)))


def _x(seed: int = 0, batch: int = 5) -> torch.Tensor:
    return torch.randn(batch, 4, generator=torch.Generator().manual_seed(seed))


def _load_written(folder: str, report, training: bool):
    """The Cell `build()` makes from the written source and checkpoint."""
    path = report.files["source"]
    spec = importlib.util.spec_from_file_location(f"written_{os.path.basename(folder)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(report.files["checkpoint"], training=training)


@pytest.mark.parametrize("structure", STRUCTURES)
def test_train_converted_branch_refused_in_eval(structure, tmp_path):
    torch.manual_seed(0)
    model = TrainOnlyTanh().train()
    x = _x()
    cell, report = convert(model, x, out=str(tmp_path), structure=structure)
    assert model.training and cell.training  # the check put both modes back
    assert report.other_mode["mode"] == "eval" and report.other_mode["status"] == "differs"
    assert "torch_module.eval() before convert" in report.other_mode["refused"]
    assert "eval mode NOT SUPPORTED by this conversion" in str(report)
    written = json.loads((tmp_path / os.path.basename(report.files["report"])).read_text())
    assert written["other_mode"]["status"] == "differs"
    assert_same_outputs(cell, model, x)  # the traced (train) mode still runs, equal to torch
    cell.set_train(False)
    with pytest.raises(RuntimeError, match=r"does not support eval mode .*torch_module\.eval\(\) before convert"):
        cell(ms.Tensor(x.numpy()))
    loaded = _load_written(str(tmp_path), report, training=False)
    with pytest.raises(RuntimeError, match=r"does not support eval mode"):
        loaded(ms.Tensor(x.numpy()))
    loaded.set_train(True)
    assert_same_outputs(loaded, model, x)


@pytest.mark.parametrize("structure", STRUCTURES)
def test_eval_converted_branch_refused_in_train(structure):
    torch.manual_seed(0)
    model = TrainOnlyTanh().eval()
    x = _x()
    cell, report = convert(model, x, structure=structure)
    assert not model.training and not cell.training
    assert report.other_mode["mode"] == "train" and report.other_mode["status"] == "differs"
    assert_same_outputs(cell, model, x)
    cell.set_train(True)
    with pytest.raises(RuntimeError, match=r"does not support train mode .*torch_module\.train\(\) before convert"):
        cell(ms.Tensor(x.numpy()))


def test_refusal_leaves_mindspore_layers_alone():
    """Only the converted root class refuses: its mapped sub-Cell (an nn.Dense) and MindSpore's own layers
    run in the refused mode."""
    torch.manual_seed(0)
    model = TrainOnlyTanh().train()
    x = _x()
    cell, _ = convert(model, x)
    cell.set_train(False)
    assert isinstance(cell.fc, nn.Dense)
    want = model.fc(x).detach().numpy()
    # float32 Dense of 4 inputs: a few eps of the output scale
    np.testing.assert_allclose(cell.fc(ms.Tensor(x.numpy())).asnumpy(), want, rtol=0,
                               atol=TOL * float(np.abs(want).max()))
    norm = nn.BatchNorm1d(3)
    norm.set_train(False)
    out = norm(ms.Tensor(want)).asnumpy()  # fresh statistics (mean 0, var 1): x / sqrt(1 + eps)
    np.testing.assert_allclose(out, want / np.sqrt(1 + 1e-5), rtol=1e-6)


@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_dropout_runs_in_both_modes(structure, training):
    """Dropout(p=0) keeps torch deterministic in train mode: both modes are checked and equal, and the check
    leaves BatchNorm's running statistics as they were, on both sides."""
    torch.manual_seed(0)
    model = NormDropout(0.0).train(training)
    x = _x()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    want = {mode: copy.deepcopy(model).train(mode)(x).detach() for mode in (True, False)}
    cell, report = convert(model, x, structure=structure)
    assert report.other_mode["status"] == "equal" and report.other_mode["max_relative_error"] <= TOL
    assert f"{'eval' if training else 'train'} mode checked: equal" in str(report)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    for mode in (False, True):  # eval first: it reads the Cell's running statistics before train updates them
        cell.set_train(mode)
        got = cell(ms.Tensor(x.numpy())).asnumpy()
        # BatchNorm over 5 rows of a 4-input Dense: float32 rounding, a few eps of the output scale
        np.testing.assert_allclose(got, want[mode].numpy(), rtol=0, atol=TOL * float(want[mode].abs().max()))


def test_dropout_in_train_is_not_checked_and_not_refused():
    torch.manual_seed(0)
    model = NormDropout(0.5).eval()
    x = _x()
    cell, report = convert(model, x, structure="modules")
    assert report.other_mode["mode"] == "train" and report.other_mode["status"] == "not checked"
    assert "dropout" in report.other_mode["reason"]
    assert "train mode not checked" in str(report)
    cell.set_train(True)
    out = cell(ms.Tensor(x.numpy())).asnumpy()  # runs: dropout zeroes some entries, scales the rest by 2
    assert out.shape == (5, 6) and np.isfinite(out).all()


def test_check_false_says_other_mode_not_checked():
    model = TrainOnlyTanh().train()
    cell, report = convert(model, _x(), check=False)
    assert report.other_mode == {"mode": "eval", "status": "not checked", "reason": "check=False"}
    assert report.to_dict()["other_mode"]["reason"] == "check=False"


def test_refuse_mode_without_the_class_is_an_error():
    with pytest.raises(MigrationError, match="no construct of class Missing"):
        refuse_mode(nn.Dense(2, 2), "class Other(nn.Cell):\n    def construct(self, x):\n        return x\n",
                    "Missing", "missing", "eval")


class EvalRefusing(torch.nn.Module):
    """torch itself refuses eval mode: nothing to compare the Cell's eval mode with."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        if not self.training:
            raise ValueError("this model only trains")
        return self.fc(x)


def test_torch_raising_in_the_other_mode_is_reported_not_checked():
    model = EvalRefusing().train()
    cell, report = convert(model, _x())
    assert report.other_mode["status"] == "not checked"
    assert report.other_mode["reason"] == "torch raises in eval mode: ValueError: this model only trains"
    assert model.training and cell.training
