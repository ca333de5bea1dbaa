"""convert(structure="modules"): one Cell class per torch module class, a loop over the CellList,
torch parameter names, symbolic batch/sequence dimensions (converted at one shape, run at another,
outputs and gradients equal torch's there), source size independent of depth, clear errors and no
partial files."""
import importlib.util
import os
import sys

import numpy as np
import pytest
import torch
import mindspore as ms
from mindspore import nn

from mindspore_hyper.migrate import TraceFailedError, UnsupportedOpError, convert
from mindspore_hyper.migrate.compare import cell_outputs, to_mindspore

from migrate_models import TOL, assert_same_outputs, bert, gpt2

pytestmark = pytest.mark.usefixtures("pynative")


def llama(layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                        max_position_embeddings=64, use_cache=False)).eval()


@pytest.fixture(scope="module")
def llama_converted():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = llama()
    cell, report = convert(model, torch.randint(0, 101, (2, 16)), structure="modules")
    return model, cell, report


def test_llama_one_class_per_torch_class_and_a_loop(llama_converted):
    model, cell, report = llama_converted
    classes = {c["class"]: c for c in report.classes}
    assert set(classes) == {"LlamaForCausalLM", "LlamaModel", "LlamaDecoderLayer", "LlamaAttention", "LlamaMLP",
                            "LlamaRMSNorm", "LlamaRotaryEmbedding", "SiLUActivation"}
    assert classes["LlamaDecoderLayer"]["modules"] == 2 and classes["LlamaRMSNorm"]["modules"] == 5
    assert classes["LlamaRMSNorm"]["hyperparameters"] == ["variance_epsilon"]
    assert classes["LlamaDecoderLayer"]["torch"] == "transformers.models.llama.modeling_llama.LlamaDecoderLayer"
    # the Cell tree is the torch module tree: generated classes, a CellList, MindSpore layers
    assert type(cell.model.layers[1]).__name__ == "LlamaDecoderLayer"
    assert type(cell.model.layers[0]) is type(cell.model.layers[1])
    assert isinstance(cell.model.layers, nn.CellList)
    assert isinstance(cell.model.layers[0].self_attn.q_proj, nn.Dense)
    assert isinstance(cell.model.embed_tokens, nn.Embedding)
    assert report.loops == ["model.layers"]
    assert report.layers["model.layers.0.self_attn.k_proj"] == "nn.Dense"
    # every torch parameter is at its torch name (Embedding's weight under MindSpore's embedding_table)
    renamed = {p.torch_name: p.cell_name for p in report.weights.placed if p.torch_name != p.cell_name}
    assert renamed == {"model.embed_tokens.weight": "model.embed_tokens.embedding_table"}
    assert {p.torch_name for p in report.weights.placed} == set(model.state_dict())
    # symbolic batch and sequence
    assert report.symbolic["input_ids"][0] and report.symbolic["input_ids"][1] and report.static == []


def test_llama_forward_and_backward_at_another_shape(llama_converted):
    model, cell, _ = llama_converted
    ids = torch.randint(0, 101, (5, 37))  # converted at (2, 16)
    assert_same_outputs(cell, model, ids)
    weights = torch.randn(101)
    model.zero_grad()
    (model(ids).logits * weights).sum().backward()
    params = cell.trainable_params()
    w = to_mindspore(weights)
    grads = ms.grad(lambda x: (cell(x) * w).sum(), None, params)(to_mindspore(ids))
    by_name = dict(model.named_parameters())
    for p, g in zip(params, grads):
        name = p.name.replace("embedding_table", "weight")
        want = by_name[name].grad.numpy()
        scale = max(float(np.abs(want).max()), 1e-30)
        assert float(np.abs(g.asnumpy() - want).max()) / scale <= 1e-4, name


def test_llama_source_is_a_port(llama_converted, tmp_path):
    _, cell, report = llama_converted
    model = llama()
    _, written = convert(model, torch.randint(0, 101, (2, 16)), structure="modules", out=str(tmp_path), check=False)
    source = open(written.files["source"], encoding="utf-8").read()
    assert source.count("class LlamaDecoderLayer(nn.Cell)") == 1
    assert "self.layers = nn.CellList([LlamaDecoderLayer() for _ in range(2)])" in source
    assert "for layer in self.layers:" in source
    assert "self.q_proj = nn.Dense(32, 32, has_bias=False)" in source
    assert "def construct(self, hidden_states" in source  # the hidden state first: the chain a pipeline cuts
    assert "(2, 16)" not in source and "16, 16" not in source  # nothing frozen to the example shape
    # the written file, imported afresh with its checkpoint, gives the same outputs at a third shape
    spec = importlib.util.spec_from_file_location("written_llama", written.files["source"])
    module = importlib.util.module_from_spec(spec)
    sys.modules["written_llama"] = module
    spec.loader.exec_module(module)
    rebuilt = module.build(written.files["checkpoint"])
    x = to_mindspore(torch.randint(0, 101, (3, 9)))
    np.testing.assert_allclose(cell_outputs(rebuilt(x))[0], cell_outputs(cell(x))[0], rtol=1e-6, atol=1e-6)


def _lines(model, shape=(2, 8)):
    _, report = convert(model, torch.randint(0, 101, shape), structure="modules", check=False)
    return report.source_lines, len(report.classes)


def test_source_grows_with_classes_not_depth():
    torch.manual_seed(0)
    shallow, deep = _lines(gpt2(n_layer=2)), _lines(gpt2(n_layer=12))  # layer_idx 8 == head_dim: not a size
    assert deep[1] == shallow[1]
    assert deep[0] / shallow[0] <= 1.2, (shallow, deep)


def test_gpt2_written_and_shape_general(tmp_path):
    torch.manual_seed(0)
    model = gpt2().eval()
    cell, report = convert(model, torch.randint(0, 101, (2, 16)), structure="modules", out=str(tmp_path))
    assert report.check["max_relative_error"] <= TOL
    assert_same_outputs(cell, model, torch.randint(0, 101, (5, 29)))  # n_positions is 32
    classes = {c["class"]: c for c in report.classes}
    assert classes["Conv1D"]["hyperparameters"] == ["nx", "nf"] and classes["GPT2Block"]["modules"] == 2
    # tied input and output embeddings stay one Parameter
    assert cell.lm_head.weight is cell.transformer.wte.embedding_table
    assert sorted(os.listdir(tmp_path)) == ["gpt2_lm_head_model.ckpt", "gpt2_lm_head_model.py",
                                            "gpt2_lm_head_model.report.json"]


def test_gpt2_size_only_values_built_once_per_shape(tmp_path):
    """The causal mask and position ids depend on the input sizes only: the generated code computes them
    once per (batch, sequence) in a cached method, not on every call, and the outputs still equal torch."""
    torch.manual_seed(0)
    model = gpt2().eval()
    cell, _ = convert(model, torch.randint(0, 101, (2, 16)), structure="modules", out=str(tmp_path))
    source = open(tmp_path / "gpt2_lm_head_model.py").read()
    construct = source.split("class GPT2Model(", 1)[1].split("def construct(", 1)[1].split("def _sized_values(")[0]
    assert "arange" not in construct and "self._sized_values(" in construct
    for shape in [(5, 29), (2, 16), (5, 29)]:
        assert_same_outputs(cell, model, torch.randint(0, 101, shape))
    assert set(cell.transformer._sized_cache) == {(2, 16), (5, 29)}


class PositionScaled(torch.nn.Module):
    """x + arange(seq) * w: the positions depend on the size only, the product reads a parameter."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        positions = torch.arange(x.shape[1]).to(x.dtype).unsqueeze(0)
        return x + positions * self.w


def test_size_only_cache_leaves_parameters_live():
    """Only the size-derived positions are cached: a changed parameter changes the next output."""
    torch.manual_seed(0)
    model = PositionScaled()
    cell, report = convert(model, torch.randn(2, 16), structure="modules")
    assert report.check["max_relative_error"] <= TOL
    with torch.no_grad():
        model.w.fill_(-2.0)
    cell.w.set_data(ms.Tensor(-2.0, ms.float32))
    for shape in [(2, 16), (3, 7)]:
        assert_same_outputs(cell, model, torch.randn(*shape))
    assert set(cell._sized_cache) == {(16,), (7,)}


def test_bert_and_vit_at_new_shapes():
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    model = bert().eval()
    cell, report = convert(model, torch.randint(0, 101, (2, 16)), structure="modules")
    assert report.loops == ["encoder.layer"]
    assert_same_outputs(cell, model, torch.randint(0, 101, (5, 29)))
    vit = ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                             image_size=16, patch_size=4, num_channels=3)).eval()
    cell, report = convert(vit, torch.randn(2, 3, 16, 16), structure="modules")
    assert report.symbolic["pixel_values"][0] is not None  # the batch
    assert report.static == ["pixel_values dimension 1 = 3", "pixel_values dimension 2 = 16",
                             "pixel_values dimension 3 = 16"]
    assert_same_outputs(cell, vit, torch.randn(5, 3, 16, 16))


class Unmapped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 4), UnmappedInner())

    def forward(self, x):
        return self.inner(x)


class UnmappedInner(torch.nn.Module):
    def forward(self, x):
        return torch.special.erfcx(x)


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_errors_name_the_module_and_op_and_write_nothing(tmp_path):
    out = tmp_path / "package"
    with pytest.raises(UnsupportedOpError, match=r"aten\.special_erfcx: no MindSpore mapping .*in module "
                                                 r"'inner\.1' \(UnmappedInner\)"):
        convert(Unmapped(), torch.randn(2, 4), structure="modules", out=str(out))
    assert not out.exists()
    with pytest.raises(TraceFailedError, match=r"torch.export cannot trace .*DataDependent: .*at .*"
                                               r"test_migrate_structured.py:\d+ `if x.sum\(\) > 0:`"):
        convert(DataDependent(), torch.randn(2, 4), structure="modules", out=str(out))
    assert not out.exists()
    with pytest.raises(ValueError, match=r"structure='tree'; expected one of \('flat', 'modules'\)"):
        convert(Unmapped(), torch.randn(2, 4), structure="tree")


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(7, 3, padding_idx=2)

    def forward(self, ids):
        return self.emb(ids)


def test_padding_idx_row_gets_no_gradient_as_in_torch():
    torch.manual_seed(0)
    model = Embed()
    cell, _ = convert(model, torch.tensor([[2, 1, 2, 5], [4, 2, 0, 1]]), structure="modules")
    assert type(cell.emb).__name__ == "PaddingEmbedding"
    ids = torch.tensor([[2, 3, 2], [0, 2, 6]])
    weights = torch.randn(2, 3, 3)
    (model(ids) * weights).sum().backward()
    grad = ms.grad(lambda x: (cell(x) * to_mindspore(weights)).sum(), None, cell.trainable_params())(to_mindspore(ids))
    np.testing.assert_allclose(grad[0].asnumpy(), model.emb.weight.grad.numpy(), rtol=1e-6, atol=1e-7)
    assert not model.emb.weight.grad[2].any() and grad[0].asnumpy()[2].tolist() == [0.0, 0.0, 0.0]


class _LengthList(torch.nn.Module):
    """CPM-Ant's pattern under a forward(*inputs) (the sweep's wrapper): a Python list as long as the input, so
    torch.export fixes the length."""

    def forward(self, *inputs):
        x = inputs[0]
        return x + torch.tensor(list(range(x.shape[1])), dtype=x.dtype)


def test_static_dimensions_are_reported_under_the_exported_input_names():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cell, report = convert(_LengthList(), (torch.randn(2, 6),))
    assert report.symbolic["inputs_0"][0] is not None and report.symbolic["inputs_0"][1] is None
    assert report.static == ["inputs_0 dimension 1 = 6"]  # was empty: looked up as a forward parameter name
    assert_same_outputs(cell, _LengthList(), torch.randn(3, 6))
