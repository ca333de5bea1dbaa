"""Worker of test_migrate_msrun.py: a converted (structure="modules") Llama trained under msrun with
tensor parallelism from YAML module_level patterns on the torch names, and the same converted Llama
on one device in the same process; writes the losses and this rank's parameter errors to JSON.

Usage (under msrun): migrate_msrun_worker.py OUT_DIR
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import json
import os
import sys

import numpy as np
import torch
import mindspore as ms
from mindspore import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper.migrate import convert  # noqa: E402
from mindspore_hyper.migrate.compare import to_mindspore  # noqa: E402
from migrate_training import NextTokenLoss  # noqa: E402

STEPS = 3
# the torch names under the loss wrapper's `lm.`
CONFIG = {"parallel_config": {"device_matrix": [2], "alias_names": ["tensor"], "module_level": [
    {"name": "lm.model.layers.*.self_attn.[qkv]_proj", "strategy": {"tensor": (2, 1)}},
    {"name": "lm.model.layers.*.self_attn.o_proj", "strategy": {"tensor": (1, 2)}},
    {"name": "lm.model.layers.*.mlp.gate_proj", "strategy": {"tensor": (2, 1)}},
    {"name": "lm.model.layers.*.mlp.up_proj", "strategy": {"tensor": (2, 1)}},
    {"name": "lm.model.layers.*.mlp.down_proj", "strategy": {"tensor": (1, 2)}}]}}


def converted():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                         max_position_embeddings=64, use_cache=False)).eval()
    return NextTokenLoss(convert(model, torch.randint(0, 101, (2, 16)), structure="modules", check=False)[0])


def main():
    out_dir = sys.argv[1]
    mh.set_context(mode="distributed", comm_timeout=60.0)
    ref, model = converted(), converted()
    par = mh.auto_parallelize(model, CONFIG)
    rank = par.local_ranks[0]
    optimizer = nn.Adam(par.optimizer_parameters(), learning_rate=1e-3)
    ref_opt = nn.Adam(ref.trainable_params(), learning_rate=1e-3)
    ref_step = ms.value_and_grad(ref, None, ref_opt.parameters)
    rng = np.random.default_rng(1)
    out = {"rank": rank, "losses": [], "ref_losses": []}
    for _ in range(STEPS):
        ids = to_mindspore(torch.from_numpy(rng.integers(0, 101, (4, 11))))
        out["losses"].append(float(par.train_step(optimizer, ids).asnumpy()))
        loss, grads = ref_step(ids)
        ref_opt(grads)
        out["ref_losses"].append(float(loss.asnumpy()))
    expected = {n: p.asnumpy() for n, p in ref.parameters_and_names()}
    local = {n: p.asnumpy() for n, p in model.parameters_and_names()}
    errors, sharded = {}, []
    for row in par.table:
        if row.name not in local:
            continue
        want = expected[row.name][row.layout.rank_slices(rank, row.global_shape)]
        errors[row.name] = float(np.abs(local[row.name] - want).max() / max(np.abs(want).max(), 1e-3))
        if local[row.name].shape != expected[row.name].shape:
            sharded.append(row.name)
    out["param_error"], out["sharded"] = errors, sharded
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
