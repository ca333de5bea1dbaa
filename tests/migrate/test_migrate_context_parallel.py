"""A converted Llama (GQA + rotary position embeddings) under context parallelism in simulation:
ring (cp 2 and 4) and Ulysses (cp 2) give the single-device losses, gradients and parameters over 5
momentum-SGD steps. The rotary tables are indexed by the whole position range and applied to sequence-sharded
q and k, so each chunk must get its global positions' rotations; the cp axis' traffic shows the
attention ran by the method."""
import numpy as np
import pytest
import torch
import mindspore as ms
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper.migrate import convert
from mindspore_hyper.shard import Layout

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
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                         max_position_embeddings=64, use_cache=False)).eval()
    ids = torch.randint(0, 101, (2, SEQ))
    return convert(model, (ids,), structure="modules")[0], ms.Tensor(ids.numpy().astype(np.int32))


@pytest.mark.parametrize("method, kind, cp", [("ring", "P2P", 2), ("ring", "P2P", 4), ("ulysses", "AllToAll", 2)])
def test_converted_llama_rotary_under_cp_trains_like_single_device(method, kind, cp):
    cell, x = _converted()
    reference = SquaredLogits(cell)
    ref_opt = nn.Momentum(reference.trainable_params(), 0.05, 0.9)
    ref_losses, ref_grads = [], None
    for _ in range(STEPS):
        loss, grads = ms.value_and_grad(reference, None, ref_opt.parameters)(x)
        ref_grads = ref_grads or [g.asnumpy() for g in grads]
        ref_opt(grads)
        ref_losses.append(float(loss))

    net = SquaredLogits(_converted()[0])
    mh.set_context(mode="simulation", device_num=cp)
    parallel = mh.auto_parallelize(net, Layout((cp,), ("cp",))(tensor_map=(), context_parallel="cp",
                                                               context_method=method))
    optimizer = nn.Momentum(parallel.optimizer_parameters(), 0.05, 0.9)
    for step in range(STEPS):
        loss = float(parallel.train_step(optimizer, x))
        assert loss == pytest.approx(ref_losses[step], rel=1e-5), f"step {step}"
        if step == 0:
            scale = max(np.abs(g).max() for g in ref_grads)
            for param, grad in zip(ref_opt.parameters, ref_grads):
                np.testing.assert_allclose(parallel.last_gradients[param.name], grad, rtol=1e-5, atol=1e-5 * scale,
                                           err_msg=param.name)
    for (name, ref_param), (_, param) in zip(reference.parameters_and_names(), net.parameters_and_names()):
        np.testing.assert_allclose(param.asnumpy(), ref_param.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    report = parallel.report()
    assert report.comm[kind]["cp"]["bytes"] > 0 and report.comm_backward[kind]["cp"]["bytes"] > 0
