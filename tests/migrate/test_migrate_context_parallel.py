"""A converted Llama (GQA + rotary position embeddings) under context parallelism in simulation:
ring and Ulysses on cp 2 give the single-device logits and gradients. The rotary tables are
indexed by the whole position range and applied to sequence-sharded q and k, so each chunk must
get its global positions' rotations; the cp axis' traffic shows the attention ran by the method."""
import numpy as np
import pytest
import torch
import mindspore as ms

import mindspore_hyper as mh
from mindspore_hyper.migrate import convert
from mindspore_hyper.shard import Layout

pytestmark = pytest.mark.usefixtures("pynative")
SEQ = 16


def _logits(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("method, kind", [("ring", "P2P"), ("ulysses", "AllToAll")])
def test_converted_llama_rotary_under_cp_equals_single_device(method, kind):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                         max_position_embeddings=64, use_cache=False)).eval()
    ids = torch.randint(0, 101, (2, SEQ))
    cell, _ = convert(model, (ids,), structure="modules")
    x = ms.Tensor(ids.numpy().astype(np.int32))
    params = cell.trainable_params()
    loss = lambda net: lambda a: (_logits(net(a)) ** 2).mean()  # noqa: E731
    ref_logits = _logits(cell(x)).asnumpy()
    ref_loss, ref_grads = ms.value_and_grad(loss(cell), None, params)(x)

    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(cell, Layout((2,), ("cp",))(tensor_map=(), context_parallel="cp",
                                                              context_method=method))
    logits = _logits(parallel(x)).asnumpy()
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5 * np.abs(ref_logits).max())
    got_loss, grads = ms.value_and_grad(loss(parallel), None, params)(x)
    assert float(got_loss) == pytest.approx(float(ref_loss), rel=1e-5)
    for param, g, r in zip(params, grads, ref_grads):
        np.testing.assert_allclose(g.asnumpy(), r.asnumpy(), rtol=1e-5, atol=1e-5 * np.abs(r.asnumpy()).max(),
                                   err_msg=param.name)
    report = parallel.report()
    assert report.comm[kind]["cp"]["bytes"] > 0 and report.comm_backward[kind]["cp"]["bytes"] > 0
