"""torch.autograd.Function subclasses with their own backward: an exact one converts (and trains as torch
does), one whose backward is not the gradient of its forward is refused unless accepted by name."""
import argparse
import textwrap

import numpy as np
import pytest
import torch

from mindspore_hyper.migrate import CustomBackwardError, TraceFailedError, convert
from mindspore_hyper.migrate.cli import add_parser

from migrate_models import TOL
from migrate_training import max_parameter_error, train_both

pytestmark = pytest.mark.usefixtures("pynative")


class ExactSiLU(torch.autograd.Function):
    """x * sigmoid(x) with a hand-written backward that is its exact gradient (a memory-saving rewrite)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * s * (1 + x * (1 - s))


class ScaledBackward(torch.autograd.Function):
    """Forward tanh(x); backward passes the gradient straight through, doubled: not tanh's gradient."""

    @staticmethod
    def forward(ctx, x):
        return torch.tanh(x)

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


class Block(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.function = function

    def forward(self, x):
        return self.function.apply(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.block = Block(function)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.block(x))


def _net(function):
    torch.manual_seed(0)
    return Net(function)


def test_exact_custom_backward_converts_and_trains_like_torch():
    model = _net(ExactSiLU)
    cell, report = convert(model, torch.randn(4, 6))
    assert list(report.custom_backward) == [f"{__name__}.ExactSiLU"]
    assert report.custom_backward[f"{__name__}.ExactSiLU"].startswith("gradient checked: equal")
    assert "ExactSiLU" in str(report) and report.to_dict()["custom_backward"] == report.custom_backward
    torch.manual_seed(1)
    batches = [(torch.randn(4, 6),) for _ in range(3)]
    torch_losses, ms_losses = train_both(model, cell, batches, lambda out, b: (out ** 2).mean(),
                                         lambda out, b: (out ** 2).mean())
    # float32 forward and backward of two tiny Linear layers: the relative rounding stays near eps (1.2e-7)
    # times a few dozen ops, well inside the forward check's TOL (1e-5); three Adam steps keep it there
    np.testing.assert_allclose(ms_losses, torch_losses, rtol=TOL)
    assert max_parameter_error(model, cell) < TOL


class MarksItsInput(torch.nn.Module):
    """SEW-D's feature extractor: in training mode it sets requires_grad on a view of its input (allowed by torch
    only while the input needs no gradient), then a Function with its own backward."""

    def __init__(self, function):
        super().__init__()
        self.net = Net(function)

    def forward(self, x):
        h = x[:, None]
        if self.training:
            h.requires_grad = True
        return self.net(h[:, 0])


@pytest.mark.parametrize("function, equal", [(ExactSiLU, True), (ScaledBackward, False)])
def test_a_forward_that_marks_its_input_is_checked_on_the_parameters(function, equal):
    """The check differentiates torch with respect to the inputs too; where the forward cannot run so (it sets
    requires_grad on a non-leaf view), it compares the parameters' gradients alone and says so; a wrong backward
    is still refused."""
    torch.manual_seed(0)
    model = MarksItsInput(function).train()
    if equal:
        _, report = convert(model, torch.randn(4, 6))
        result = report.custom_backward[f"{__name__}.ExactSiLU"]
        assert result.startswith("gradient checked: equal") and "parameters only" in result, result
    else:
        with pytest.raises(CustomBackwardError, match="parameters only"):
            convert(model, torch.randn(4, 6))


@pytest.mark.parametrize("structure", ["modules", "flat"])
def test_wrong_custom_backward_is_refused_naming_the_function_and_where(structure):
    with pytest.raises(CustomBackwardError) as info:
        convert(_net(ScaledBackward), torch.randn(4, 6), structure=structure)
    message = str(info.value)
    assert f"{__name__}.ScaledBackward at 'block'" in message
    assert "not the gradient of its forward" in message and "custom_backward='differentiate'" in message
    assert "differentiates the Function's forward" in message
    difference = float(message.split("max relative gradient difference ")[1].split()[0])
    assert difference > 0.1  # backward 2*g against (1 - tanh^2) g: at least a factor 2 apart per entry


def test_the_opt_in_converts_and_records_the_difference(tmp_path):
    model = _net(ScaledBackward)
    x = torch.randn(4, 6)
    cell, report = convert(model, x, out=str(tmp_path), custom_backward="differentiate")
    result = report.custom_backward[f"{__name__}.ScaledBackward"]
    assert result.startswith("gradient differs, accepted") and "max relative gradient difference" in result
    assert report.check["max_relative_error"] < TOL  # the forward is still tanh, as torch's
    assert "ScaledBackward" in (tmp_path / "net.report.json").read_text()


def test_no_function_leaves_the_report_empty_and_apply_restored():
    original = torch.autograd.function.Function.__dict__["apply"]
    _, report = convert(torch.nn.Linear(6, 2), torch.randn(3, 6))
    assert report.custom_backward == {}
    assert torch.autograd.function.Function.__dict__["apply"] is original


def test_apply_is_restored_when_the_forward_raises():
    original = torch.autograd.function.Function.__dict__["apply"]
    with pytest.raises(TraceFailedError, match=r"torch cannot run .*Net on the example inputs: RuntimeError: mat1"):
        convert(_net(ExactSiLU), torch.randn(4, 5))  # Linear(6, 6) on 5 features
    assert torch.autograd.function.Function.__dict__["apply"] is original


def test_bad_custom_backward_value_is_refused():
    with pytest.raises(ValueError, match=r"custom_backward='ignore'; expected one of \('check', 'differentiate'\)"):
        convert(_net(ExactSiLU), torch.randn(4, 6), custom_backward="ignore")


def test_bad_custom_backward_value_is_refused_by_the_cli(capsys):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["convert", "m:Net", "--input-shape", "4,6", "--out", "o", "--custom-backward", "ignore"])
    assert info.value.code == 2
    assert "--custom-backward: invalid choice: 'ignore'" in capsys.readouterr().err


def test_cli_refuses_then_accepts_with_the_flag(tmp_path, monkeypatch, capsys):
    source = open(__file__, encoding="utf-8").read()
    models = source[source.index("class ScaledBackward"):source.index("def _net")]
    (tmp_path / "custom_models.py").write_text("import torch\n\n\n" + textwrap.dedent(models)
                                               + "\n\ndef make():\n    return Net(ScaledBackward)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    argv = ["convert", "custom_models:make", "--input-shape", "4,6", "--out", "out"]
    args = parser.parse_args(argv)
    assert args.func(args) == 1
    assert "custom_models.ScaledBackward at 'block'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    args = parser.parse_args(argv + ["--custom-backward", "differentiate"])
    assert args.func(args) == 0
    summary = capsys.readouterr().out
    assert "torch.autograd.Functions with their own backward" in summary
    assert "custom_models.ScaledBackward: gradient differs, accepted" in summary


class TrainingOnly(torch.nn.Module):
    """Dropout, then an exact custom Function only in training mode (identity in eval): the eval-mode
    comparison that dropout forces cannot see the Function."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        h = self.drop(self.fc(x))
        return ExactSiLU.apply(h) if self.training else h


def test_a_function_only_training_runs_is_refused_as_unchecked_under_dropout():
    torch.manual_seed(0)
    model = TrainingOnly().train()
    with pytest.raises(CustomBackwardError) as info:
        convert(model, torch.randn(4, 6))
    message = str(info.value)
    assert f"{__name__}.ExactSiLU at the root" in message and "runs only in training mode" in message
    assert model.training  # the modes are restored
    _, report = convert(model, torch.randn(4, 6), custom_backward="differentiate")
    assert report.custom_backward[f"{__name__}.ExactSiLU"].startswith("not checked")
