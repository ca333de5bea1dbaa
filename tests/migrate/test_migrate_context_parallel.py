"""A converted Llama (GQA + rotary position embeddings) under context parallelism in simulation:
ring and Ulysses on cp 2, cp 4 and data 2 x tensor 2 x cp 2 give the single-device losses, gradients
and parameters over 5 momentum-SGD steps. The rotary tables are indexed by the whole position range and applied to sequence-sharded
q and k, so each chunk must get its global positions' rotations; the cp axis' traffic shows the
attention ran by the method."""
import numpy as np
import pytest
import torch
import mindspore as ms
from mindspore import nn

from mindspore_hyper.migrate import convert
from mindspore_hyper.shard import Layout
from sim_checks import trains_like_single_device

pytestmark = pytest.mark.usefixtures("pynative")
SEQ, STEPS = 16, 5


def _logits(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class SquaredLogits(nn.Cell):
    """The converted model's logits squared and averaged: a loss that reaches every logit."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, ids):
        return (_logits(self.net(ids)) ** 2).mean()


def _converted():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=8, num_key_value_heads=4, vocab_size=101,
                                         max_position_embeddings=64, use_cache=False)).eval()
    ids = torch.randint(0, 101, (2, SEQ))
    return convert(model, (ids,), structure="modules")[0], ms.Tensor(ids.numpy().astype(np.int32))


MESHES = {"cp2": Layout((2,), ("cp",)), "cp4": Layout((4,), ("cp",)),
          "data2 x tensor2 x cp2": Layout((2, 2, 2), ("data", "tensor", "cp"))}


def _strategy(mesh_name, method):
    s = MESHES[mesh_name](tensor_map=(), context_parallel="cp", context_method=method)
    if "tensor" in s.mesh.alias_names:  # Megatron: q/k/v and gate/up column, o/down row parallel
        for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            s.override(f"*.{name}.weight", "tensor")
        s.override("*.o_proj.weight", None, "tensor").override("*.down_proj.weight", None, "tensor")
    return s


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("method, kind", [("ring", "P2P"), ("ulysses", "AllToAll")])
def test_converted_llama_rotary_under_cp_trains_like_single_device(method, kind, mesh_name):
    x = _converted()[1]
    parallel = trains_like_single_device(lambda: SquaredLogits(_converted()[0]), (x,), (),
                                         _strategy(mesh_name, method), STEPS)
    report = parallel.report()
    assert report.comm[kind]["cp"]["bytes"] > 0 and report.comm_backward[kind]["cp"]["bytes"] > 0
