"""Sparse MoE blocks: transformers' MixtralSparseMoeBlock becomes mindspore_hyper.moe.MoE (softmax
router, top-k renormalised, SwiGLU experts as batched weights) and Qwen2-MoE's block (a sigmoid-gated
shared expert, which MoE has not) is converted generically with its experts computed densely, the
reason in the report; both equal torch at the example shape and at another one."""
import numpy as np
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.compare import to_mindspore
from mindspore_hyper.moe import MoE

from migrate_models import assert_same_outputs

pytestmark = pytest.mark.usefixtures("pynative")


class Block(torch.nn.Module):
    """A model around one sparse MoE block (random weights large enough that routing matters)."""

    def __init__(self, block):
        super().__init__()
        self.moe = block
        for p in self.moe.parameters():
            torch.nn.init.normal_(p, std=0.2)

    def forward(self, x):
        return self.moe(x)


def mixtral():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(0)
    return Block(MixtralSparseMoeBlock(MixtralConfig(hidden_size=16, intermediate_size=32, num_local_experts=4,
                                                     num_experts_per_tok=2))).eval()


def test_mixtral_block_becomes_moe_with_torch_outputs_and_gradients():
    model = mixtral()
    cell, report = convert(model, torch.randn(2, 5, 16), structure="modules")
    assert isinstance(cell.moe.moe, MoE) and report.layers["moe"] == "mindspore_hyper.moe.MoE"
    assert (cell.moe.moe.num_experts, cell.moe.moe.top_k, cell.moe.moe.experts.w_gate.shape) == (4, 2, (4, 16, 32))
    placed = {(p.torch_name, p.cell_name) for p in report.weights.placed}
    assert ("moe.experts.gate_up_proj", "moe.moe.experts.w_up") in placed
    assert ("moe.gate.weight", "moe.moe.router.weight") in placed
    x = torch.randn(3, 7, 16)
    assert_same_outputs(cell, model, x)
    weights = torch.randn(3, 7, 16)
    (model(x) * weights).sum().backward()
    grads = ms.grad(lambda a: (cell(a) * to_mindspore(weights)).sum(), None, [cell.moe.moe.experts.w_down])(
        to_mindspore(x))
    want = model.moe.experts.down_proj.grad.numpy().transpose(0, 2, 1)
    np.testing.assert_allclose(grads[0].asnumpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_qwen2_moe_block_is_converted_generically_and_says_why():
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    torch.manual_seed(0)
    model = Block(Qwen2MoeSparseMoeBlock(Qwen2MoeConfig(hidden_size=16, moe_intermediate_size=32,
                                                        shared_expert_intermediate_size=24, num_experts=4,
                                                        num_experts_per_tok=2))).eval()
    cell, report = convert(model, torch.randn(2, 5, 16), structure="modules")
    assert not any(isinstance(c, MoE) for _, c in cell.cells_and_names())
    assert any("sigmoid(shared_expert_gate(x))" in n and "computed densely" in n for n in report.notes)
    assert {"Qwen2MoeSparseMoeBlock", "Qwen2MoeExperts", "Qwen2MoeTopKRouter"} <= {c["class"] for c in report.classes}
    assert_same_outputs(cell, model, torch.randn(3, 7, 16))
