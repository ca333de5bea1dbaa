"""Unsupported ops and bad arguments: each is a clear error naming the op and its torch source line."""
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import TraceFailedError, UnsupportedOpError, convert

from migrate_models import TorchMLP

THIS_FILE = __file__


def line_of(code: str) -> str:
    """`this_file:N` of the line holding `code`, as error messages cite it."""
    with open(THIS_FILE, encoding="utf-8") as f:
        number = next(i for i, line in enumerate(f, 1) if code in line and "line_of" not in line)
    return f"{THIS_FILE}:{number}"


pytestmark = pytest.mark.usefixtures("pynative")


class UnmappedOps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = torch.cummax(self.fc(x), dim=1).values  # no mapping
        z = torch.div(x, 2.0, rounding_mode="trunc")  # mapped, but this mode is not
        return y + z + torch.lgamma(x)  # no mapping


@pytest.mark.parametrize("structure, ns", [("flat", "torch"), ("modules", "aten")])  # fx names torch functions
def test_every_unsupported_op_is_listed_with_its_line(structure, ns):
    with pytest.raises(UnsupportedOpError) as info:
        convert(UnmappedOps(), torch.randn(2, 4), structure=structure)
    problems = info.value.problems
    assert len(problems) == 3, problems
    cummax, div, lgamma = problems
    assert cummax.startswith(f"{ns}.cummax: no MindSpore mapping") and "y = torch.cummax(self.fc(x)" in cummax
    assert line_of("torch.cummax(self.fc(x)") in cummax
    assert div.startswith(f"{ns}.div: div(rounding_mode='trunc') is not mapped")
    assert line_of('rounding_mode="trunc")  #') in div
    assert lgamma.startswith(f"{ns}.lgamma") and line_of("torch.lgamma(x)  #") in lgamma
    # the partial report lists what did convert
    assert ("torch.nn.Linear", "nn.Dense") in {(r["torch"], r["mindspore"]) for r in info.value.report.mapping_table()}


class ControlFlowAndUnmapped(torch.nn.Module):
    """fx cannot trace the data-dependent branch; export can, and then meets an unmapped aten op."""

    def forward(self, x):
        if x.shape[0] > 1:
            x = x * 2
        return torch.special.erfcx(x)


def test_export_route_names_the_aten_op_and_line():
    with pytest.raises(UnsupportedOpError, match=r"aten\.special_erfcx: no MindSpore mapping") as info:
        convert(ControlFlowAndUnmapped(), torch.randn(2, 4), structure="flat")
    assert line_of("return torch.special.erfcx(x)") in info.value.problems[0]


class InPlaceOnInput(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


class InPlaceOnView(torch.nn.Module):
    def forward(self, x):
        y = x * 1
        y[:, 0].add_(1)
        return y


class InPlaceFresh(torch.nn.Module):
    def forward(self, x):
        y = x * 3
        y.add_(1)
        y += 2
        return torch.relu(y)


def test_in_place_updates():
    with pytest.raises(UnsupportedOpError, match=r"mul_ on `x`: updates a model input"):  # Tensor. or aten.
        convert(InPlaceOnInput(), torch.randn(2, 3))
    with pytest.raises(UnsupportedOpError, match=r"updates a view of another tensor"):
        convert(InPlaceOnView(), torch.randn(2, 3))
    cell, report = convert(InPlaceFresh(), torch.randn(2, 3))
    assert report.rewritten and all("add_" in r for r in report.rewritten)
    assert report.check["max_relative_error"] <= 1e-6


def test_unsupported_module_configuration_names_the_module():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4, momentum=None))
    with pytest.raises(UnsupportedOpError, match=r"torch.nn.BatchNorm1d at '1': BatchNorm1d\(momentum=None\)"):
        convert(model, torch.randn(3, 4))


def test_bad_arguments():
    with pytest.raises(TypeError, match="torch_module: expected a torch.nn.Module, got Dense"):
        convert(ms.nn.Dense(2, 2), torch.randn(2, 4))
    with pytest.raises(TypeError, match="example_inputs: expected a torch.Tensor or a tuple of them, got float"):
        convert(TorchMLP(), 1.0)
    with pytest.raises(TypeError, match=r"example inputs do not fit TorchMLP.forward\(x\)"):
        convert(TorchMLP(), (torch.randn(2, 16), torch.randn(2, 16)))
    with pytest.raises(ValueError, match=r"tracer='jit'; expected one of \('auto', 'fx', 'export'\)"):
        convert(TorchMLP(), torch.randn(2, 16), tracer="jit", structure="flat")
    with pytest.raises(ValueError, match=r"tracer='fx' chooses the tracer of the flat trace: pass structure='flat'"):
        convert(TorchMLP(), torch.randn(2, 16), tracer="fx")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(ValueError, match="mindspore.set_context\\(mode=mindspore.PYNATIVE_MODE\\)"):
            convert(TorchMLP(), torch.randn(2, 16))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


class Untraceable(torch.nn.Module):
    def forward(self, x):
        return torch.tensor([float(v) for v in x.tolist()[0]])


def test_trace_failure_gives_both_reasons():
    with pytest.raises(TraceFailedError, match=r"cannot trace Untraceable:\n  torch.fx: .*\n  torch.export: "):
        convert(Untraceable(), torch.randn(1, 3), structure="flat")
