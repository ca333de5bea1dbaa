"""A converted transformers Llama (structure="modules") in the dry run: its training step's
per-device memory and collectives equal the numeric simulation's exactly (data x tensor from
module-level patterns on the torch names)."""
import pytest
import torch
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.compare import to_mindspore

from migrate_training import NextTokenLoss
from test_migrate_structured import llama

pytestmark = pytest.mark.usefixtures("pynative")

CONFIG = {"parallel_config": {"device_matrix": [2, 2], "alias_names": ["data", "tensor"], "module_level": [
    {"name": "lm.model.layers.*.self_attn.[qkv]_proj", "strategy": {"tensor": (2, 1)}},
    {"name": "lm.model.layers.*.self_attn.o_proj", "strategy": {"tensor": (1, 2)}},
    {"name": "lm.model.layers.*.mlp.gate_proj", "strategy": {"tensor": (2, 1)}},
    {"name": "lm.model.layers.*.mlp.up_proj", "strategy": {"tensor": (2, 1)}},
    {"name": "lm.model.layers.*.mlp.down_proj", "strategy": {"tensor": (1, 2)}}]}}


def test_converted_llama_dry_run_equals_simulation(clean_context):
    torch.manual_seed(0)
    cell, _ = convert(llama(), torch.randint(0, 101, (2, 16)), structure="modules", check=False)
    ids = to_mindspore(torch.randint(0, 101, (4, 12)))
    reports = {}
    for mode in ("simulation", "dryrun"):
        clean_context.set_context(mode=mode, device_num=4)
        model = mh.auto_parallelize(NextTokenLoss(cell), CONFIG)
        optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
        model.train_step(optimizer, ids)
        reports[mode] = model.report(optimizer)
    sim, dry = reports["simulation"], reports["dryrun"]
    assert sim.memory == dry.memory
    assert sim.comm == dry.comm and sim.comm_backward == dry.comm_backward
    assert "tensor" in str(dry.comm) and dry.comm_backward
