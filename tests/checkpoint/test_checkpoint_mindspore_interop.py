"""MindSpore's own tools read our checkpoint steps through the `strategy.ckpt` written in them:
`unified_safetensors` merges the (deduplicated) per-rank files into whole tensors, which
`load_distributed_checkpoint` loads into a plain Cell or re-slices for a target strategy file
(`save_strategy_file`); `transform_checkpoints` refuses deduplicated checkpoints (documented)."""
import glob

import numpy as np
import pytest
import mindspore as ms
from mindspore.parallel import load_distributed_checkpoint, transform_checkpoints, unified_safetensors

import mindspore_hyper as mh
from mindspore_hyper import auto_parallelize
from mindspore_hyper.checkpoint import save_strategy_file
from ckpt_models import adam, global_values, gpt, megatron, step_dir


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    """A simulated 8-device GPT (data 2 x tensor 4, ZeRO-1 Adam states) saved, then merged by
    MindSpore: (checkpoint step directory, merged directory, global values)."""
    root = tmp_path_factory.mktemp("interop")
    mh.reset_context()
    mh.set_context(device_num=8)
    ms.set_seed(1)
    model = gpt()
    par = auto_parallelize(model, megatron(2, 4, zero=True))
    optimizer = adam(par.optimizer_parameters())
    mh.save_checkpoint(par, root / "ckpt", optimizer=optimizer)
    mh.reset_context()
    step = step_dir(root / "ckpt")  # a step directory is laid out as MindSpore's tools expect
    unified_safetensors(str(step), str(step / "strategy.ckpt"), str(root / "merged"),
                        merge_with_redundancy=False, max_process_num=1)
    return step, root / "merged", global_values(model, optimizer)


def test_unified_safetensors_merges_every_parameter_and_optimizer_state(merged):
    _, out, values = merged
    files = glob.glob(str(out / "*.safetensors"))
    stored = {}
    for path in files:
        stored.update({k: v.asnumpy() for k, v in ms.load_checkpoint(path, format="safetensors").items()})
    assert sorted("opt:" + k if "opt:" + k in values else k for k in stored) == sorted(values)
    for name, value in stored.items():
        want = values.get(name, values.get("opt:" + name))
        np.testing.assert_array_equal(value.reshape(want.shape), want, err_msg=name)  # 0-d: MindSpore stores [1]


def test_load_distributed_checkpoint_into_a_plain_cell(merged):
    _, out, values = merged
    net = gpt()
    load_distributed_checkpoint(net, format="safetensors", unified_safetensors_dir=str(out))
    for name, p in net.parameters_and_names():
        np.testing.assert_array_equal(p.asnumpy(), values[name], err_msg=name)


def test_load_distributed_checkpoint_reslices_for_our_strategy_file(merged, tmp_path, clean_context):
    _, out, values = merged
    mh.set_context(device_num=4)
    target = auto_parallelize(gpt(), megatron(2, 2, zero=False))
    save_strategy_file(target, str(tmp_path / "target.ckpt"))
    load_distributed_checkpoint(None, predict_strategy=str(tmp_path / "target.ckpt"), format="safetensors",
                                unified_safetensors_dir=str(out), dst_safetensors_dir=str(tmp_path / "sliced"),
                                max_process_num=1)
    for rank in range(4):
        (path,) = glob.glob(str(tmp_path / "sliced" / f"rank_{rank}" / "*.safetensors"))
        sliced = ms.load_checkpoint(path, format="safetensors")
        assert sorted(sliced) == sorted(row.name for row in target.table)
        for row in target.table:
            want = values[row.name][row.layout.rank_slices(rank, row.global_shape)]
            np.testing.assert_array_equal(sliced[row.name].asnumpy(), want, err_msg=f"rank {rank} {row.name}")


def test_transform_checkpoints_refuses_deduplicated_checkpoints(merged, tmp_path, clean_context):
    """MindSpore's transform_checkpoints wants every rank's full (non-deduplicated) file; ours
    hold each replicated region once, so it stops at the first rank file lacking one."""
    ckpt, _, _ = merged
    mh.set_context(device_num=4)
    save_strategy_file(auto_parallelize(gpt(), megatron(2, 2, zero=False)), str(tmp_path / "target.ckpt"))
    # ranks 4-7 hold only ZeRO-1 slices: every rank has a file, but rank 1's lacks the replicated
    # parameters rank 0 wrote (without ZeRO-1 a data replica has no file at all: "The safetensor
    # file of rank<r> is needed ...")
    with pytest.raises(ValueError, match=r"The param: blocks\.0\.attn\.proj\.bias in rank 1 is missing"):
        transform_checkpoints(str(ckpt), str(tmp_path / "out"), "part", str(ckpt / "strategy.ckpt"),
                              str(tmp_path / "target.ckpt"), output_format="safetensors")
