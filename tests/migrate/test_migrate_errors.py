"""Unsupported ops and bad arguments: each is a clear error naming the op and its torch source line."""
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import TraceFailedError, UnsupportedOpError, convert

from migrate_models import TOL, TorchMLP

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
        z = torch.scatter(x, 1, torch.zeros(2, 4, dtype=torch.long), x, reduce="add")  # mapped, this mode not
        return y + z + torch.lgamma(x)  # no mapping


@pytest.mark.parametrize("structure, ns", [("flat", "torch"), ("modules", "aten")])  # fx names torch functions
def test_every_unsupported_op_is_listed_with_its_line(structure, ns):
    with pytest.raises(UnsupportedOpError) as info:
        convert(UnmappedOps(), torch.randn(2, 4), structure=structure)
    problems = info.value.problems
    assert len(problems) == 3, problems
    cummax, scatter, lgamma = problems
    assert cummax.startswith(f"{ns}.cummax: no MindSpore mapping") and "y = torch.cummax(self.fc(x)" in cummax
    assert line_of("torch.cummax(self.fc(x)") in cummax
    assert scatter.startswith(f"{ns}.scatter: scatter(reduce='add') is not mapped")
    assert line_of('reduce="add")  #') in scatter
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


class InPlaceOnInputView(torch.nn.Module):
    def forward(self, x):
        x[:, 0].add_(1)
        return x * 2


class StaleViewAfterWrite(torch.nn.Module):
    def forward(self, x):
        y = x * 1
        rest = y[:, 1:]  # a view taken before the write below and read after it
        y[:, :1].copy_(x[:, :1] * 2)
        return rest + 1


class InPlaceFresh(torch.nn.Module):
    def forward(self, x):
        y = x * 3
        y.add_(1)
        y += 2
        return torch.relu(y)


def test_in_place_updates():
    with pytest.raises(UnsupportedOpError, match=r"mul_ on `x`: updates a model input"):  # Tensor. or aten.
        convert(InPlaceOnInput(), torch.randn(2, 3))
    with pytest.raises(UnsupportedOpError, match=r"updates a view of another tensor"):  # the flat trace (fx)
        convert(InPlaceOnView(), torch.randn(2, 3), structure="flat")
    with pytest.raises(UnsupportedOpError, match=r"add_ on `select\w*`: updates a view of a model input"):
        convert(InPlaceOnInputView(), torch.randn(2, 3))
    with pytest.raises(UnsupportedOpError, match=r"other views of `mul\w*` taken before the update are read after"):
        convert(StaleViewAfterWrite(), torch.randn(2, 3))
    cell, report = convert(InPlaceFresh(), torch.randn(2, 3))
    assert report.rewritten and all("add_" in r for r in report.rewritten)
    assert report.check["max_relative_error"] <= 1e-6


def test_a_write_into_a_slice_of_a_fresh_tensor_becomes_a_scatter():
    """The port rewrites `y[:, 0].add_(1)` on a tensor the program made as a scatter into a copy of `y`; it
    equals torch (the ops are exact: copies and one add, so the tolerance is float32's own rounding of x * 1 + 1)
    at the example shape and another."""
    from migrate_models import assert_same_outputs

    cell, report = convert(InPlaceOnView(), torch.randn(2, 3))
    assert any("add_" in r and "scatter" in r for r in report.rewritten)
    assert report.check["max_relative_error"] <= 1e-6
    assert_same_outputs(cell, InPlaceOnView(), torch.randn(5, 4))


class RowsWrittenThroughSelects(torch.nn.Module):
    """Gated DeltaNet's forward substitution as transformers writes it for export (Qwen3.5, OLMo-hybrid): rows of
    a matrix the program made written through a select then a slice, `a[..., i, :i] = ...`, each row read back by
    the next, then the identity added (`torch.eye`); and whole-slice selects of a zeros tensor written in a loop."""

    def forward(self, x):
        a = -(x.transpose(1, 2) @ x).tril(-1)
        for i in range(1, 4):
            row = a[..., i, :i].clone()
            sub = a[..., :i, :i].clone()
            a[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
        out = torch.zeros_like(a)
        for i in range(2):
            out[:, :, i] = a[:, :, 2 * i] * 2
        return a + torch.eye(4), out


def test_writes_through_a_chain_of_selects_and_slices_become_nested_scatters():
    """`a[..., i, :i] = r` (a slice of a select of a fresh tensor) becomes a scatter into the select's value and
    that into the whole; refused before ("updates a view of ... another view"). Forward at a second shape and the
    input's gradient equal torch's. Tolerance: TOL (1e-5): contractions of at most 7 terms through ~10 chained
    float32 ops, each within ~7 u = 4e-7 on either side, differ by a few 1e-6 at most; a wrong row or a missed
    write changes values by O(1)."""
    from migrate_models import assert_same_outputs
    from mindspore_hyper.migrate.compare import relative_error, to_mindspore

    torch.manual_seed(0)
    cell, report = convert(RowsWrittenThroughSelects(), torch.randn(2, 5, 4))
    assert sum("copy_ on `slice" in r and "scatter" in r for r in report.rewritten) == 3
    assert report.check["max_relative_error"] <= TOL
    x = torch.randn(3, 7, 4, requires_grad=True)
    assert_same_outputs(cell, RowsWrittenThroughSelects(), x.detach())
    weights = torch.randn(3, 4, 4)
    a, out = RowsWrittenThroughSelects()(x)
    ((a * weights).sum() + out.sum()).backward()
    w = to_mindspore(weights)
    grad = ms.grad(lambda v: (lambda a_, o_: (a_ * w).sum() + o_.sum())(*cell(v)))(to_mindspore(x.detach()))
    assert relative_error([grad.asnumpy()], [x.grad.numpy()]) <= TOL


class ViewUpdatedAlone(torch.nn.Module):
    """Funnel's relative attention (`positional_attn *= cls_mask`): an in-place update of a slice of a reshape of a
    tensor the program made; with `read_base`, that tensor is read after the update too (it sees the write)."""

    def __init__(self, read_base=False):
        super().__init__()
        self.read_base = read_base

    def forward(self, x):
        made = x * 2
        view = made.reshape(x.shape[0], 2, 3)[:, :, 1:]
        view *= torch.sigmoid(x).reshape(x.shape[0], 2, 3)[:, :, :2]
        return view + made.sum() if self.read_base else view + 1


def test_an_update_seen_only_through_its_view_is_rewritten_out_of_place():
    """Exact ops on both sides (a product and a sigmoid of one element), so the tolerance is float32's rounding."""
    from migrate_models import assert_same_outputs

    cell, report = convert(ViewUpdatedAlone(), torch.randn(2, 6))
    assert any("mul_" in r and "nothing reads afterwards" in r for r in report.rewritten)
    assert report.check["max_relative_error"] <= 1e-6
    assert_same_outputs(cell, ViewUpdatedAlone(), torch.randn(5, 6))
    with pytest.raises(UnsupportedOpError, match=r"mul_ on `slice\w*`: updates a view of"):
        convert(ViewUpdatedAlone(read_base=True), torch.randn(2, 6))


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


class TopKRenormalised(torch.nn.Module):
    def forward(self, x):
        top, index = torch.topk(x, 2, dim=-1)
        top /= top.sum(dim=-1, keepdim=True)  # an item of topk's tuple: a tensor of its own, not a view
        return top, index


class SplitItemUpdated(torch.nn.Module):
    def forward(self, x):
        a, b = x.split(2, dim=-1)
        a /= 2  # an item of split's tuple: a view of x
        return a + b


def test_in_place_update_of_an_op_result_item_versus_a_split_item():
    from migrate_models import assert_same_outputs

    cell, report = convert(TopKRenormalised(), torch.rand(2, 5) + 0.1)
    assert any("div_" in r and "out-of-place" in r for r in report.rewritten)
    assert_same_outputs(cell, TopKRenormalised(), torch.rand(3, 7) + 0.1)
    with pytest.raises(UnsupportedOpError, match=r"div_ on `getitem\w*`: updates a view of another tensor"):
        convert(SplitItemUpdated(), torch.rand(2, 4))
