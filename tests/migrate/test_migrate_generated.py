"""Never invalid output: the port is convert's default (symbolic dimensions reported); generated names are
valid and unique by construction (the Qwen2-MoE duplicate-argument case); a module whose class cannot be
generated becomes its traced body, for that module only, with the reason in the report; the source is
compiled and imported before anything is written; no partial files on failure."""
import importlib.util
import inspect
import sys

import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import MigrationError, convert
from mindspore_hyper.migrate.naming import identifier

from migrate_models import TOL, assert_same_outputs

pytestmark = pytest.mark.usefixtures("pynative")


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_identifier_is_valid_and_unique():
    taken = set()
    names = [identifier(t, taken, reserved={"ms", "build"}) for t in
             ["hidden_dim", "hidden_dim", "class", "slice", "sum", "0x", "a-b", "ms", "build", ""]]
    assert names == ["hidden_dim", "hidden_dim_1", "class_1", "slice_1", "sum_1", "v_0x", "a_b", "ms_1",
                     "build_1", "v"]
    assert all(n.isidentifier() for n in names) and len(set(names)) == len(names)
    classes = set()
    assert [identifier(t, classes, suffix="") for t in ["Block", "Block", "Block"]] == ["Block", "Block2", "Block3"]


def qwen2(moe: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=101, max_position_embeddings=64, use_cache=False)
    if not moe:
        return Qwen2ForCausalLM(Qwen2Config(**sizes)).eval()
    # moe_intermediate_size 16: the experts' gate_up_proj is (4, 32, 32), two dimensions equal to hidden_dim
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(**sizes, moe_intermediate_size=16, shared_expert_intermediate_size=32,
                                              num_experts=4, num_experts_per_tok=2)).eval()


def test_default_is_the_port_at_another_batch_and_length():
    """The issue's case: Qwen2 converted at (2, 16) with no structure given runs at batch 3, length 7."""
    model = qwen2(moe=False)
    cell, report = convert(model, torch.randint(0, 101, (2, 16)))
    assert report.tracer == "torch.export (module-structured)" and report.loops == ["model.layers"]
    assert all(report.symbolic["input_ids"]) and not report.static  # batch and sequence symbolic
    assert ("input input_ids: dim 0 symbolic (may change between calls), dim 1 symbolic (may change between calls)"
            in str(report).splitlines())
    assert_same_outputs(cell, model, torch.randint(0, 101, (3, 7)))


def test_flat_only_on_request():
    model = qwen2(moe=False)
    _, report = convert(model, torch.randint(0, 101, (2, 8)), structure="flat", check=False)
    assert report.tracer == "torch.export" and report.symbolic == {"input_ids": [None, None]}
    assert report.static == ["input_ids dimension 0 = 2", "input_ids dimension 1 = 8"]


def test_qwen2_moe_compiles_with_unique_arguments(tmp_path):
    """Qwen2-MoE used to write `def __init__(self, num_experts, hidden_dim, hidden_dim, ...)` (SyntaxError) for its
    experts class. Its blocks now become mindspore_hyper.moe.MoE; with its shared experts' activation set to GELU
    (a shared expert MoE has not) they are converted generically again, so the experts class is generated."""
    model = qwen2(moe=True)
    for module in model.modules():
        if hasattr(module, "shared_expert"):
            module.shared_expert.act_fn = torch.nn.GELU()
    cell, report = convert(model, torch.randint(0, 101, (2, 16)), out=str(tmp_path))
    assert report.check["max_relative_error"] <= TOL and not report.fallbacks
    written = load(report.files["source"], "written_qwen2_moe")
    experts = inspect.signature(written.Qwen2MoeExperts.__init__).parameters
    assert list(experts) == ["self", "num_experts", "hidden_dim", "intermediate_dim"]
    for klass in vars(written).values():  # every generated signature: no name twice
        if isinstance(klass, type) and issubclass(klass, ms.nn.Cell) and "__init__" in vars(klass):
            params = list(inspect.signature(klass.__init__).parameters)
            assert len(params) == len(set(params)), klass
    # the layers share their classes (one per torch class), MoE experts computed densely and exactly
    assert {c["class"] for c in report.classes} >= {"Qwen2MoeSparseMoeBlock", "Qwen2MoeExperts"}
    assert not any(c["class"].endswith("2") for c in report.classes)
    cell2 = written.build(report.files["checkpoint"])
    assert_same_outputs(cell2, model, torch.randint(0, 101, (3, 9)))


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8))
        self.eps = 1e-3

    def forward(self, x):
        return x * self.w + self.eps * x.shape[1]


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.scale = Scale()

    def forward(self, x):
        return self.scale(torch.relu(self.fc(x)))


def test_a_class_that_cannot_be_generated_becomes_its_traced_body(monkeypatch, tmp_path):
    """A generator bug (here: injected, the duplicate argument of the Qwen2-MoE case) costs that module its
    class only: it is written as its traced body, the report says which module and why, outputs equal torch."""
    from mindspore_hyper.migrate import codegen_modules

    real = codegen_modules._class_body

    def broken(prog, units, lists, code, unit, plain=False, fixed=None):
        text, hyper = real(prog, units, lists, code, unit, plain, fixed)
        if type(prog.module).__name__ == "Scale" and not plain:
            text = text.replace("def __init__(self", "def __init__(self, eps, eps", 1)
        return text, hyper
    monkeypatch.setattr(codegen_modules, "_class_body", broken)
    torch.manual_seed(0)
    model = Outer()
    cell, report = convert(model, torch.randn(2, 4, 8), out=str(tmp_path))
    assert [(f["module"], f["torch"].rsplit(".", 1)[-1]) for f in report.fallbacks] == [("scale", "Scale")]
    assert "SyntaxError: duplicate argument 'eps' in function definition" in report.fallbacks[0]["reason"]
    assert "modules written as their traced body" in str(report)
    assert "(its traced body)" in open(report.files["source"]).read()
    assert_same_outputs(cell, model, torch.randn(3, 5, 8))  # still shape-general
    written = load(report.files["source"], "written_outer")
    assert_same_outputs(written.build(report.files["checkpoint"]), model, torch.randn(2, 6, 8))


def test_source_that_does_not_compile_is_never_written(monkeypatch, tmp_path):
    from mindspore_hyper.migrate import convert_modules

    real = convert_modules.generate_modules

    def corrupt(*args, **kwargs):
        code = real(*args, **kwargs)
        code.source = code.source.replace("def build(", "def build(checkpoint, checkpoint, ", 1)
        return code
    monkeypatch.setattr(convert_modules, "generate_modules", corrupt)
    out = tmp_path / "out"
    with pytest.raises(MigrationError, match=r"generated source of Outer does not compile \(nothing was written\): "
                                             r"SyntaxError: duplicate argument 'checkpoint'"):
        convert(Outer(), torch.randn(2, 4, 8), out=str(out))
    assert not out.exists()


def test_no_partial_files_when_writing_fails(monkeypatch, tmp_path):
    from mindspore_hyper.migrate import converter

    def fail(cell, path):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")
    monkeypatch.setattr(converter.ms, "save_checkpoint", fail)
    out = tmp_path / "new"
    with pytest.raises(OSError, match="disk full"):
        convert(Outer(), torch.randn(2, 4, 8), out=str(out), check=False)
    assert not out.exists()  # the directory it created is gone too
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("x")
    with pytest.raises(OSError):
        convert(Outer(), torch.randn(2, 4, 8), out=str(kept), check=False)
    assert sorted(p.name for p in kept.iterdir()) == ["mine.txt"]


class Frozen(torch.nn.Module):
    """A fixed (sinusoidal-like) position table beside a trained embedding, as Whisper's encoder has."""

    def __init__(self):
        super().__init__()
        self.tokens = torch.nn.Embedding(11, 4)
        self.positions = torch.nn.Embedding(8, 4)
        self.positions.requires_grad_(False)

    def forward(self, ids):
        return self.tokens(ids) + self.positions.weight[: ids.shape[1]]


def test_frozen_torch_parameters_stay_frozen():
    """A MindSpore layer's table is trainable by default: the Cell freezes what torch froze."""
    torch.manual_seed(0)
    cell, report = convert(Frozen(), torch.randint(0, 11, (2, 5)))
    assert report.weights.frozen == ["positions.embedding_table"]
    assert [p.name for p in cell.trainable_params()] == ["tokens.embedding_table"]


class NoGradRegion(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        with torch.no_grad():  # exported as a nested graph (wrap_with_set_grad_enabled): inlined, no gradient out
            frozen = x * self.w * 2
        return x * self.w + frozen


def test_no_grad_region_is_inlined_and_passes_no_gradient():
    """The Cell's gradient of w is torch's, x only (d(x w)/dw), not 3x (as without the stop at the region's end)."""
    torch.manual_seed(0)
    model = NoGradRegion()
    cell, report = convert(model, torch.randn(2, 3))
    assert any("torch.no_grad() region" in n for n in report.notes), report.notes
    x = torch.randn(4, 3)
    assert_same_outputs(cell, model, x)
    model(x).sum().backward()
    from mindspore_hyper.migrate.compare import to_mindspore

    grad = ms.grad(lambda a: cell(a).sum(), None, [cell.w])(to_mindspore(x))[0].asnumpy()
    # sums of 4 float32 values: equal to rounding (1e-6 relative)
    assert abs(grad - model.w.grad.numpy()).max() <= 1e-6 * abs(model.w.grad.numpy()).max()


class Recurrent(torch.nn.Module):
    """One block applied twice, the first time under no_grad (HRM's L_module cycles)."""

    def __init__(self):
        super().__init__()
        self.block = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 3))

    def forward(self, x):
        with torch.no_grad():
            z = self.block(x)
        return self.block(z + x)


def test_no_grad_call_of_a_module_leaves_its_other_calls_trained():
    """The stop at the region's end sits in the caller, not in the block's class (shared by both calls): the
    block's gradients are torch's (from the second call only), not zero."""
    torch.manual_seed(0)
    model = Recurrent()
    cell, _ = convert(model, torch.randn(2, 3))
    x = torch.randn(4, 3)
    assert_same_outputs(cell, model, x)
    (model(x) ** 2).sum().backward()
    from mindspore_hyper.migrate.compare import to_mindspore

    params = cell.trainable_params()
    grads = ms.grad(lambda a: (cell(a) ** 2).sum(), None, params)(to_mindspore(x))
    want = [p.grad.numpy() for p in model.parameters()]
    assert len(grads) == len(want) == 4
    for got, expected in zip(grads, want):
        # 3-term dot products and tanh through two linear layers, summed over 4 rows, in float32: within ~20 u =
        # 1.2e-6 of exact on each side; 1e-5 of the largest component (a zero gradient, as with the stop inside
        # the block, is off by 100%)
        assert abs(got.asnumpy().reshape(expected.shape) - expected).max() <= 1e-5 * abs(expected).max()


class CheckedLengths(torch.nn.Module):
    """Flaubert's input check (`assert lengths.max().item() <= slen`) and DynamicCache's first update (its empty
    (0,) start concatenated with the keys)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 4)

    def forward(self, ids):
        lengths = (ids != 0).sum(dim=1)
        torch._check(lengths.max().item() <= ids.shape[1])  # as export records Flaubert's assert
        keys = torch.cat([torch.tensor([]), self.embed(ids)], dim=-2)
        return keys * lengths[:, None, None]


def test_value_assertion_is_dropped_and_named_and_empty_cat_operand_skipped():
    torch.manual_seed(0)
    model = CheckedLengths()
    cell, report = convert(model, torch.randint(0, 11, (2, 5)))
    dropped = [n for n in report.notes if "run-time assertion on tensor values dropped" in n]
    assert len(dropped) == 1 and "lengths.max().item()" in dropped[0], report.notes
    assert_same_outputs(cell, model, torch.randint(0, 11, (3, 7)))  # another shape: nothing fixed to the first


class ShortConvolution(torch.nn.Module):
    """Reads its Conv1d's weight as a tensor (Mamba's and Inkling's short convolutions do)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 4, 3, groups=4, padding=2)

    def forward(self, x):
        y = torch.nn.functional.conv1d(x.transpose(1, 2), self.conv.weight, self.conv.bias, padding=2, groups=4)
        return y[..., :x.shape[1]].transpose(1, 2)


def test_a_conv1d_weight_read_as_a_tensor_is_the_torch_layout():
    """MindSpore's Conv1d keeps its weight as (out, in, 1, k); read by the parent it is reshaped to torch's
    (out, in, k): outputs (3-tap sums) and the weight's gradient equal torch's to float32 rounding (1e-6)."""
    torch.manual_seed(0)
    model = ShortConvolution()
    cell, _ = convert(model, torch.randn(2, 5, 4))
    x = torch.randn(3, 7, 4)
    assert_same_outputs(cell, model, x)
    model(x).sum().backward()
    from mindspore_hyper.migrate.compare import to_mindspore

    grad = ms.grad(lambda a: cell(a).sum(), None, [cell.conv.weight])(to_mindspore(x))[0].asnumpy()
    want = model.conv.weight.grad.numpy()
    assert abs(grad.reshape(want.shape) - want).max() <= 1e-6 * abs(want).max()


class EmptySlice(torch.nn.Module):
    """DeepSeek-V4's compression: the first (T // 4) * 4 positions, none below 4 tokens."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 3))

    def forward(self, x):
        usable = (x.shape[1] // 4) * 4
        return torch.cat([x[:, :usable] * 2, x], 1) * self.w


def test_a_slice_empty_on_the_example_trains_at_every_length():
    """Empty at the example length (3 < 4): written through slice_dim (MindSpore's CPU gradient of an empty slice
    fails); forward and gradient equal torch's there and at a length where the slice is not empty."""
    model = EmptySlice()
    cell, _ = convert(model, torch.randn(2, 3, 3))
    from mindspore_hyper.migrate.compare import to_mindspore

    for x in (torch.randn(2, 3, 3), torch.randn(2, 9, 3)):
        assert_same_outputs(cell, model, x)
        model.w.grad = None
        model(x).sum().backward()
        grad = ms.grad(lambda a: cell(a).sum(), None, [cell.w])(to_mindspore(x))[0].asnumpy()
        want = model.w.grad.numpy()  # sums of <= 54 float32 values: 1e-5 relative is far above their rounding
        assert abs(grad - want).max() <= 1e-5 * abs(want).max()


class PositionWeights(torch.nn.Module):
    """Computes Python numbers from its input's length (as Funnel's pooling and CPM-Ant's mask do), so
    torch.export fixes that length; a forward(*inputs) as the sweep's wrapped models have (input `inputs_0`)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, *inputs):
        x = inputs[0]
        weights = torch.tensor([1.0 / (i + 1) for i in range(x.size(1))])
        return self.proj(x) * weights[None, :, None]


def test_a_fixed_input_dimension_is_checked_by_the_generated_cell(tmp_path):
    """The report's fixed length is checked on entry: another length is refused with the input, dimension and
    both sizes (not an op's shape error later); another batch (symbolic) runs and equals torch. Outputs: a
    4-term float32 dot product times a float32 weight, a few units of rounding (~1e-7) each: 1e-5 relative."""
    torch.manual_seed(0)
    model = PositionWeights()
    cell, report = convert(model, torch.randn(2, 5, 4), out=str(tmp_path))
    assert report.symbolic["inputs_0"][0] is not None and "inputs_0 dimension 1 = 5" in report.static
    written = load(report.files["source"], "written_position_weights").build(report.files["checkpoint"])
    for converted in (cell, written):
        assert_same_outputs(converted, model, torch.randn(3, 5, 4))
        with pytest.raises(ValueError, match=r"PositionWeights: input inputs_0 \(argument inputs\) has shape "
                                             r"\(2, 7, 4\); its dimension 1 must be 5: torch.export fixed it"):
            converted(ms.Tensor(torch.randn(2, 7, 4).numpy()))
        with pytest.raises(ValueError, match=r"has shape \(5,\); its dimension 1 must be 5"):  # lower rank
            converted(ms.Tensor(torch.randn(5).numpy()))


class Projection(torch.nn.Module):
    """A root whose constructor needs arguments (as JetMoE's JetMoeMoE block converted alone)."""

    def __init__(self, input_size, output_size, eps=1e-3):
        super().__init__()
        self.input_size, self.output_size, self.eps = input_size, output_size, eps
        self.weight = torch.nn.Parameter(torch.randn(input_size, output_size))

    def forward(self, x):
        return (x @ self.weight) / (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()


def test_a_root_with_constructor_arguments_builds_with_its_recorded_values(tmp_path):
    """The generated root takes the hyper-parameters its code uses with the torch instance's values as defaults:
    the loader and the written build() make it without arguments; other values still build another size.
    Outputs: a 6-term float32 dot product over a root-mean-square, a few units of rounding: 1e-5 relative."""
    torch.manual_seed(0)
    model = Projection(6, 5)
    cell, report = convert(model, torch.randn(2, 6), out=str(tmp_path))
    assert sorted(report.classes[-1]["hyperparameters"]) == ["eps", "input_size", "output_size"]
    assert (cell.input_size, cell.output_size, cell.eps) == (6, 5, 1e-3)
    written = load(report.files["source"], "written_projection")
    assert_same_outputs(written.build(report.files["checkpoint"]), model, torch.randn(3, 6))
    assert tuple(written.Projection(input_size=3, output_size=2).weight.shape) == (3, 2)
