"""convert(): outputs equal torch's (float32, <= 1e-5 relative) for an MLP, the design's
TransformerBlock, a ResNet in eval and train mode, GPT-2 and BERT with attention masks; the
written source + checkpoint reproduce the Cell; gradients and an SGD step equal torch's."""
import importlib.util
import sys

import numpy as np
import pytest
import torch
import mindspore as ms
from mindspore import nn

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.compare import cell_outputs, relative_error, to_mindspore, torch_outputs

from migrate_models import TOL, TorchMLP, TorchTransformerBlock, assert_same_outputs, bert, gpt2, resnet


pytestmark = pytest.mark.usefixtures("pynative")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def load_written(report, name):
    """Import the written source as a fresh module and build the Cell from the written checkpoint."""
    spec = importlib.util.spec_from_file_location(name, report.files["source"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.build(report.files["checkpoint"])


def test_mlp_outputs_and_written_files(tmp_path):
    model = TorchMLP()
    x = torch.randn(4, 16)
    cell, report = convert(model, x, out=str(tmp_path), structure="flat")  # the flat trace: torch.fx
    assert report.tracer == "torch.fx"
    assert_same_outputs(cell, model, x)
    assert report.check["max_relative_error"] <= TOL
    rows = {(r["torch"], r["mindspore"]): r["count"] for r in report.mapping_table()}
    assert rows == {("torch.nn.Linear", "nn.Dense"): 2, ("torch.nn.GELU", "nn.GELU"): 1}
    assert sorted(n for n, _ in cell.parameters_and_names()) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    # the source written to disk is importable and, with the checkpoint, gives the same outputs
    rebuilt = load_written(report, "written_mlp")
    assert type(rebuilt).__name__ == "TorchMLP"
    np.testing.assert_array_equal(cell_outputs(rebuilt(to_mindspore(x)))[0], cell_outputs(cell(to_mindspore(x)))[0])
    # the fx-traced Cell is shape-generic
    assert_same_outputs(cell, model, torch.randn(7, 16))


def test_transformer_block_fx_is_shape_generic():
    model = TorchTransformerBlock()
    cell, report = convert(model, torch.randn(2, 8, 32), structure="flat")
    assert report.tracer == "torch.fx"
    assert_same_outputs(cell, model, torch.randn(2, 8, 32))
    assert_same_outputs(cell, model, torch.randn(3, 5, 32))  # shapes come from x.shape at run time
    used = {r["torch"] for r in report.mapping_table()}
    assert {"torch.nn.LayerNorm", "torch.nn.Linear", "Tensor.chunk", "operator.matmul", "torch.triu"} <= used


@pytest.mark.parametrize("training", [False, True])
def test_resnet_batchnorm(training):
    model = resnet().train(training)
    x = torch.randn(2, 3, 32, 32)
    cell, report = convert(model, x)
    assert report.tracer == "torch.export (module-structured)"  # the default: the port
    assert cell.training is training
    assert any(r["torch"] == "torch.nn.BatchNorm2d" and r["mindspore"] == "nn.BatchNorm2d"
               for r in report.mapping_table())
    assert len(report.weights.dropped) == 6  # num_batches_tracked, one per BatchNorm
    assert_same_outputs(cell, model, x)
    if training:
        # one training forward moves the running statistics the same way in both
        params = dict(cell.parameters_and_names())
        for name, buf in model.named_buffers():
            if name.endswith("running_mean") or name.endswith("running_var"):
                ms_name = name.replace("running_mean", "moving_mean").replace("running_var", "moving_variance")
                np.testing.assert_allclose(params[ms_name].asnumpy(), buf.numpy(), rtol=1e-5, atol=1e-6,
                                           err_msg=name)
        assert not np.allclose(params["embedder.embedder.normalization.moving_variance"].asnumpy(), 1.0)


@pytest.fixture(scope="module")
def converted_gpt2(tmp_path_factory):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    model = gpt2().eval()
    ids = torch.randint(0, 101, (2, 8))
    out = tmp_path_factory.mktemp("gpt2")
    cell, report = convert(model, ids, out=str(out), structure="flat")  # the flat trace, specialised to (2, 8)
    return model, ids, cell, report


def test_gpt2_outputs_ties_and_written_files(converted_gpt2):
    model, ids, cell, report = converted_gpt2
    assert report.tracer == "torch.export" and report.outputs == ["logits"]
    assert_same_outputs(cell, model, ids)
    assert cell.lm_head.weight is cell.transformer.wte.embedding_table  # tied as in torch
    assert report.folded, "the causal mask and position ids are computed at conversion time"
    rebuilt = load_written(report, "written_gpt2")
    np.testing.assert_array_equal(cell_outputs(rebuilt(to_mindspore(ids)))[0], cell_outputs(cell(to_mindspore(ids)))[0])
    with pytest.raises(ValueError, match=r"converted for input_ids of shape \(2, 8\)"):
        cell(to_mindspore(torch.randint(0, 101, (2, 9))))


def test_bert_with_attention_mask():
    model = bert().eval()
    ids = torch.randint(0, 101, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 5:] = 0
    cell, report = convert(model, ids, example_kwargs={"attention_mask": mask})
    assert report.outputs == ["last_hidden_state", "pooler_output"]
    assert_same_outputs(cell, model, ids, attention_mask=mask)
    # the mask is an input, not a constant: other padding gives other (still equal) outputs
    other = torch.ones(2, 8, dtype=torch.int64)
    other[0, 3:] = 0
    assert_same_outputs(cell, model, ids, attention_mask=other)
    with torch.no_grad():
        a = torch_outputs(model(ids, attention_mask=mask))
        b = torch_outputs(model(ids, attention_mask=other))
    assert relative_error(a, b) > 1e-3


def test_gradients_and_sgd_step_equal_torch():
    model = gpt2(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0).train()
    ids = torch.randint(0, 101, (2, 8))
    cell, report = convert(model, ids)
    weights = torch.randn(2, 8, 101)
    torch_names = {p.torch_name: p.cell_name for p in report.weights.placed}

    loss = (model(ids).logits * weights).sum()
    loss.backward()
    params = cell.trainable_params()
    ms_weights = to_mindspore(weights)
    value, grads = ms.value_and_grad(lambda x: (cell(x) * ms_weights).sum(), None, params)(to_mindspore(ids))
    np.testing.assert_allclose(value.asnumpy(), loss.item(), rtol=TOL)
    by_name = {p.name: g.asnumpy() for p, g in zip(params, grads)}
    scale = max(np.abs(g).max() for g in by_name.values())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(by_name[torch_names[name]], p.grad.numpy(), rtol=TOL, atol=TOL * scale,
                                   err_msg=name)

    torch.optim.SGD(model.parameters(), lr=0.1).step()
    nn.SGD(params, learning_rate=0.1)(grads)
    current = dict(cell.parameters_and_names())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(current[torch_names[name]].asnumpy(), p.detach().numpy(), rtol=TOL, atol=1e-6,
                                   err_msg=name)
    assert_same_outputs(cell, model, ids)
