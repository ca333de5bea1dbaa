"""A converted (structure="modules") Llama runs under auto_parallelize in simulation as written: data x
tensor from YAML module_level patterns on the torch names, and `pipeline: 2` over its CellList (the
traced-chain pipeline cuts the generated loop), with the outputs, gradients and training of the
Cell on one device."""
import numpy as np
import pytest
import torch
import mindspore as ms
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.compare import cell_outputs, relative_error, to_mindspore
from mindspore_hyper.pipeline import PipelineModel

from migrate_models import TOL
from migrate_training import NextTokenLoss, next_token_loss_ms
from test_migrate_structured import llama

pytestmark = pytest.mark.usefixtures("pynative")


def converted():
    cell, _ = convert(llama(), torch.randint(0, 101, (2, 16)), structure="modules", check=False)
    return cell


def test_data_by_tensor_from_module_patterns_on_torch_names(clean_context):
    cell = converted()
    config = {"parallel_config": {"device_matrix": [2, 2], "alias_names": ["data", "tensor"], "module_level": [
        {"name": "model.layers.*.self_attn.[qkv]_proj", "strategy": {"tensor": (2, 1)}},
        {"name": "model.layers.*.self_attn.o_proj", "strategy": {"tensor": (1, 2)}},
        {"name": "model.layers.*.mlp.gate_proj", "strategy": {"tensor": (2, 1)}},
        {"name": "model.layers.*.mlp.up_proj", "strategy": {"tensor": (2, 1)}},
        {"name": "model.layers.*.mlp.down_proj", "strategy": {"tensor": (1, 2)}}]}}
    ids = to_mindspore(torch.randint(0, 101, (4, 11)))
    ref = cell_outputs(cell(ids))
    clean_context.set_context(mode="simulation", device_num=4)
    simulated = mh.auto_parallelize(cell, config)
    assert relative_error(cell_outputs(simulated(ids)), ref) <= TOL
    sharded = {r.name for r in simulated.table if r.layout.sharded_axes()}
    assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"} <= sharded
    assert not any("norm" in n or "embed" in n for n in sharded)
    params = cell.trainable_params()
    want = ms.grad(lambda x: NextTokenLoss(cell)(x), None, params)(ids)
    grads = ms.grad(lambda x: next_token_loss_ms(simulated(x), x), None, params)(ids)
    for p, g, w in zip(params, grads, want):
        scale = max(float(np.abs(w.asnumpy()).max()), 1e-30)
        assert float(np.abs(g.asnumpy() - w.asnumpy()).max()) / scale <= 1e-4, p.name


def test_pipeline_2_over_the_cell_list_trains_like_one_device(clean_context):
    ids = to_mindspore(torch.randint(0, 101, (4, 12)))
    reference = NextTokenLoss(converted())
    optimizer = nn.Adam(reference.trainable_params(), 1e-3)
    step = ms.value_and_grad(reference, None, optimizer.parameters)
    want = []
    for _ in range(3):
        loss, grads = step(ids)
        optimizer(grads)
        want.append(float(loss.asnumpy()))
    model = NextTokenLoss(converted())
    clean_context.set_context(mode="simulation", device_num=2)
    config = {"parallel_config": {"device_matrix": [2], "alias_names": ["pipeline"],
                                  "module_level": [{"name": "*", "strategy": {"pipeline": 2}}]}}
    parallel = mh.auto_parallelize(model, config)
    assert isinstance(parallel, PipelineModel)
    pipe_opt = nn.Adam(parallel.optimizer_parameters(), 1e-3)
    got = [float(parallel.train_step(pipe_opt, ids).asnumpy()) for _ in range(3)]
    assert parallel.split == (1, 1)
    assert "lm.model.layers.0.self_attn.q_proj.weight" in {n for n, _ in parallel.stage_cells[0].parameters_and_names()}
    np.testing.assert_allclose(got, want, rtol=1e-5)
    by_name = dict(reference.parameters_and_names())
    for name, p in model.parameters_and_names():
        if p.requires_grad:
            np.testing.assert_allclose(p.asnumpy(), by_name[name].asnumpy(), rtol=1e-4, atol=1e-5, err_msg=name)
