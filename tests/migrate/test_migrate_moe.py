"""Sparse MoE blocks: transformers' MixtralSparseMoeBlock becomes mindspore_hyper.moe.MoE (softmax
router, top-k renormalised, SwiGLU experts as batched weights), and so do Qwen3-MoE's, OLMoE's and Qwen2-MoE's
(its shared expert scaled by a sigmoid gate: MoE's gated shared expert) and DeepSeek-V3's (sigmoid routing with
its score correction bias, top-2-sum groups and scaling factor; its plain shared expert) and gpt-oss's (a
biased router weighting the top-k logits by their softmax, biased clamped-SwiGLU experts), each checked against
the block's own forward first; a block whose shared expert MoE has not is
converted generically with its experts computed densely, the reason in the report; all equal torch at the example
shape and at another one. Experts behind transformers'
use_experts_implementation (grouped_mm by default: aten.histc) are computed densely after a check, and refused
by name when the check fails."""
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

    def __init__(self, block, std=0.2):
        super().__init__()
        self.moe = block
        for p in self.moe.parameters():
            torch.nn.init.normal_(p, std=std)

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


def qwen2_moe_block(**config):
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    torch.manual_seed(0)
    return Block(Qwen2MoeSparseMoeBlock(Qwen2MoeConfig(hidden_size=16, moe_intermediate_size=32,
                                                       shared_expert_intermediate_size=24, num_experts=4,
                                                       num_experts_per_tok=2, **config))).eval()


def test_qwen2_moe_block_becomes_moe_with_its_gated_shared_expert():
    """Qwen2-MoE: Mixtral's routing (norm_topk_prob) plus a shared SwiGLU expert scaled by
    sigmoid(shared_expert_gate(x)): MoE(shared_ffn_hidden, shared_expert_gate=True), equal to torch, gradients of
    the gate's weight included."""
    model = qwen2_moe_block()
    cell, report = convert(model, torch.randn(2, 5, 16), structure="modules")
    moe = cell.moe.moe
    assert isinstance(moe, MoE) and report.layers["moe"] == "mindspore_hyper.moe.MoE"
    assert moe.shared.gate_score is not None and moe.shared.up.weight.shape == (24, 16)
    placed = {(p.torch_name, p.cell_name) for p in report.weights.placed}
    assert ("moe.shared_expert_gate.weight", "moe.moe.shared.gate_score.weight") in placed
    x, weights = torch.randn(3, 7, 16), torch.randn(3, 7, 16)
    assert_same_outputs(cell, model, x)
    (model(x) * weights).sum().backward()
    grads = ms.grad(lambda a: (cell(a) * to_mindspore(weights)).sum(), None,
                    [moe.shared.gate_score.weight, moe.shared.down.weight])(to_mindspore(x))
    for got, want in zip(grads, (model.moe.shared_expert_gate.weight.grad, model.moe.shared_expert.down_proj.weight.grad)):
        want = want.numpy()
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_a_shared_expert_moe_does_not_have_is_converted_generically_and_says_why():
    """A shared expert with another activation (GELU) is not MoE's: generic conversion, experts computed densely,
    the reason in the report."""
    model = qwen2_moe_block()
    model.moe.shared_expert.act_fn = torch.nn.GELU()
    cell, report = convert(model, torch.randn(2, 5, 16), structure="modules")
    assert not any(isinstance(c, MoE) for _, c in cell.cells_and_names())
    assert any("converted generically, its experts computed densely" in n and
               "shared expert is not a bias-free SiLU SwiGLU" in n for n in report.notes), report.notes
    assert {"Qwen2MoeSparseMoeBlock", "Qwen2MoeExperts", "Qwen2MoeTopKRouter"} <= {c["class"] for c in report.classes}
    assert_same_outputs(cell, model, torch.randn(3, 7, 16))


@pytest.mark.parametrize("family, normalize", [("qwen3_moe", False), ("olmoe", True)])
def test_qwen3_moe_and_olmoe_blocks_become_moe(family, normalize):
    """Mixtral's routing with norm_topk_prob either way: MoE(normalize_top_k=norm_topk_prob), equal to torch."""
    import importlib

    from transformers import AutoConfig

    names = {"qwen3_moe": ("Qwen3MoeSparseMoeBlock", "num_experts"), "olmoe": ("OlmoeSparseMoeBlock", "num_experts")}
    block_name, experts_key = names[family]
    config = AutoConfig.for_model(family, hidden_size=16, intermediate_size=32, moe_intermediate_size=32,
                                  num_experts_per_tok=2, norm_topk_prob=normalize, **{experts_key: 4})
    block = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), block_name)
    torch.manual_seed(0)
    model = Block(block(config)).eval()
    cell, report = convert(model, torch.randn(2, 5, 16))
    assert isinstance(cell.moe.moe, MoE) and report.layers["moe"] == "mindspore_hyper.moe.MoE"
    assert cell.moe.moe.router.normalize_top_k is normalize
    assert_same_outputs(cell, model, torch.randn(3, 7, 16))


class LookalikeExperts(torch.nn.Module):
    """Named and shaped like transformers' experts (gate_up_proj (E, 2F, H), down_proj (E, H, F), SiLU act_fn)
    but computing something else (the gate and up halves swapped): its forward must not be replaced by the
    dense formulation."""

    def __init__(self, experts=3, hidden=8, ffn=4):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(experts, 2 * ffn, hidden) * 0.3)
        self.down_proj = torch.nn.Parameter(torch.randn(experts, hidden, ffn) * 0.3)
        self.act_fn = torch.nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        chosen = (top_k_index[..., None] == torch.arange(self.gate_up_proj.shape[0])).to(hidden_states.dtype)
        weights = (chosen * top_k_weights[..., None]).sum(1)
        up, gate = torch.matmul(hidden_states.unsqueeze(0), self.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
        out = torch.matmul(self.act_fn(gate) * up, self.down_proj.transpose(1, 2))
        return (out * weights.transpose(0, 1)[:, :, None]).sum(0)


class LookalikeBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(8, 3, bias=False)
        self.experts = LookalikeExperts()

    def forward(self, x):
        flat = x.reshape(-1, 8)
        top, index = torch.topk(torch.softmax(self.router(flat), -1), 2, dim=-1)
        return self.experts(flat, index, top).reshape(x.shape)


def test_experts_that_only_look_alike_are_not_replaced():
    torch.manual_seed(0)
    model = LookalikeBlock().eval()
    cell, report = convert(model, torch.randn(2, 5, 8))
    assert any("experts (LookalikeExperts) left as written" in n and "differs from its forward" in n
               for n in report.notes), report.notes
    assert_same_outputs(cell, model, torch.randn(3, 4, 8))


def deepseek_v3_block(groups=2, topk_group=1):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    config = DeepseekV3Config(hidden_size=16, moe_intermediate_size=8, n_routed_experts=8, num_experts_per_tok=2,
                              n_group=groups, topk_group=topk_group, n_shared_experts=1, routed_scaling_factor=2.5)
    torch.manual_seed(0)
    model = Block(DeepseekV3MoE(config)).eval()
    with torch.no_grad():
        model.moe.gate.e_score_correction_bias.copy_(torch.randn(8) * 0.3)  # the bias changes the choice
    return model


def test_deepseek_v3_block_becomes_moe_with_torch_outputs_and_gradients():
    """DeepSeek-V3's routing (sigmoid scores, the choice by the scores plus e_score_correction_bias within each
    token's best group by top-2 score sum, the chosen scores renormalised and scaled by routed_scaling_factor) and
    its ungated shared expert: MoE(scoring="sigmoid", score_bias=True, group_score="top2_sum", ...), equal to
    torch at another shape, gradients of the router and the experts included; the bias is placed, not trained."""
    model = deepseek_v3_block()
    cell, report = convert(model, torch.randn(2, 5, 16))
    moe = cell.moe.moe
    assert isinstance(moe, MoE) and report.layers["moe"] == "mindspore_hyper.moe.MoE"
    router = moe.router
    assert (router.scoring, router.group_score, router.num_groups, router.topk_groups, router.routed_scaling_factor,
            moe.shared.gate_score) == ("sigmoid", "top2_sum", 2, 1, 2.5, None)
    np.testing.assert_array_equal(router.score_bias.asnumpy(), model.moe.gate.e_score_correction_bias.numpy())
    assert not router.score_bias.requires_grad
    placed = {(p.torch_name, p.cell_name) for p in report.weights.placed}
    assert {("moe.gate.e_score_correction_bias", "moe.moe.router.score_bias"),
            ("moe.shared_experts.down_proj.weight", "moe.moe.shared.down.weight")} <= placed
    x, weights = torch.randn(3, 7, 16), torch.randn(3, 7, 16)
    assert_same_outputs(cell, model, x)
    (model(x) * weights).sum().backward()
    grads = ms.grad(lambda a: (cell(a) * to_mindspore(weights)).sum(), None,
                    [router.weight, moe.experts.w_down, moe.shared.gate.weight])(to_mindspore(x))
    wants = (model.moe.gate.weight.grad.numpy().T, model.moe.experts.down_proj.grad.numpy().transpose(0, 2, 1),
             model.moe.shared_experts.gate_proj.weight.grad.numpy())
    for got, want in zip(grads, wants):
        # float32 on both sides: sums of <= 16-term products, relative 1e-4 with an absolute floor near zero
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_a_block_with_deepseek_v3_attributes_computing_otherwise_stays_generic_and_says_why():
    """A router with DeepSeek-V3's attributes whose forward differs (its groups ranked by the best score, V2's rule,
    not the top-2 sum): MoE's formulation is checked against the block's own forward on the example input, found
    to differ, and the block is converted generically (experts densely), the difference in the report, equal to
    torch."""
    model = deepseek_v3_block(groups=4, topk_group=1)
    gate = model.moe.gate

    def v2_forward(hidden_states):
        logits = torch.nn.functional.linear(hidden_states.reshape(-1, 16).float(), gate.weight.float())
        scores = logits.sigmoid()
        choice = (scores + gate.e_score_correction_bias).reshape(-1, 4, 2)
        best = choice.max(-1).values.topk(1, dim=-1).indices
        keep = torch.zeros(choice.shape[:2]).scatter(1, best, 1.0).repeat_interleave(2, dim=1).bool()
        index = choice.reshape(-1, 8).masked_fill(~keep, float("-inf")).topk(2, dim=-1).indices
        top = scores.gather(1, index)
        return logits, top / (top.sum(-1, keepdim=True) + 1e-20) * gate.routed_scaling_factor, index

    gate.forward = v2_forward
    x = torch.randn(2, 5, 16)
    cell, report = convert(model, x)
    assert not any(isinstance(c, MoE) for _, c in cell.cells_and_names())
    assert any("moe (DeepseekV3MoE): converted generically" in n and "differs from its forward" in n
               for n in report.notes), report.notes
    assert_same_outputs(cell, model, torch.randn(3, 7, 16))


def gpt_oss_block():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = GptOssConfig(hidden_size=16, intermediate_size=8, num_local_experts=4, num_experts_per_tok=2,
                          swiglu_limit=0.7)  # a small limit: the clamps act on these values
    torch.manual_seed(0)
    return Block(GptOssMLP(config), std=0.3).eval()  # its forward returns the block's (output, router scores)


def test_gpt_oss_block_becomes_moe_with_torch_outputs_and_gradients():
    """gpt-oss's MLP (a biased router whose top-k logits are weighted by their softmax, biased experts with the
    clamped SwiGLU over interleaved gate/up columns) becomes MoE(router_bias, scoring="topk_softmax",
    expert_bias, activation="clamped_swiglu"); its Cell returns (output, router scores) as the block does; both
    equal torch at another shape, and so do the gradients of the router's bias and the experts' biases."""
    model = gpt_oss_block()
    cell, report = convert(model, torch.randn(2, 5, 16))
    moe = cell.moe.moe
    assert isinstance(moe, MoE) and report.layers["moe"] == "mindspore_hyper.moe.MoE"
    assert (moe.router.scoring, moe.experts.clamp, moe.experts.has_bias) == ("topk_softmax", (1.702, 0.7), True)
    placed = {(p.torch_name, p.cell_name, p.transform) for p in report.weights.placed}
    assert ("moe.experts.gate_up_proj", "moe.moe.experts.w_up", "odd columns (E, H, 2F) -> (E, H, F)") in placed
    assert ("moe.router.bias", "moe.moe.router.bias", "as is") in placed
    x, weights = torch.randn(3, 7, 16), torch.randn(3, 7, 16)
    assert_same_outputs(cell, model, x)
    (model(x)[0] * weights).sum().backward()
    grads = ms.grad(lambda a: (cell(a)[0] * to_mindspore(weights)).sum(), None,
                    [moe.router.bias, moe.experts.b_up, moe.experts.b_down, moe.experts.w_gate])(to_mindspore(x))
    e = model.moe.experts
    wants = (model.moe.router.bias.grad.numpy(), e.gate_up_proj_bias.grad.numpy()[:, 1::2],
             e.down_proj_bias.grad.numpy(), e.gate_up_proj.grad.numpy()[:, :, 0::2])
    for got, want in zip(grads, wants):
        # float32 on both sides: sums of <= 21-term products, relative 1e-4 with an absolute floor near zero
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_gpt_oss_block_whose_scores_are_unused_returns_its_output_alone():
    """In gpt-oss's decoder layer the router scores are dropped (`hidden_states, _ = self.mlp(...)`): torch.export
    keeps the block's used output only, and the generated Cell returns that alone, equal to torch."""
    model = gpt_oss_block()
    model.forward = lambda x: model.moe(x)[0] * 2.0
    cell, report = convert(model, torch.randn(2, 5, 16))
    assert isinstance(cell.moe.moe, MoE)
    x = torch.randn(3, 7, 16)
    assert isinstance(cell.moe(to_mindspore(x)), ms.Tensor)  # the block's Cell: its output alone, no tuple
    assert_same_outputs(cell, model, x)


@pytest.mark.parametrize("make", ["deepseek_v3", "gpt_oss"])
def test_converted_blocks_run_expert_parallel_like_one_device(make, clean_context):
    """The converted DeepSeek-V3 and gpt-oss blocks are MoE Cells, so expert parallelism applies: on data 2 x
    expert 2 in simulation (experts split over `expert`, tokens over both axes) the outputs (gpt-oss's router scores
    too) and the router's and experts' gradients equal the converted Cell on one device."""
    import mindspore_hyper as mh
    from mindspore_hyper import Layout

    model = deepseek_v3_block() if make == "deepseek_v3" else gpt_oss_block()
    cell, _ = convert(model, torch.randn(2, 5, 16))
    clean_context.set_context(device_num=4)
    strategy = Layout((2, 2), ("data", "expert"))(tensor_map=()).override("moe.moe.experts.*", "expert")
    par = mh.auto_parallelize(cell, strategy)
    x = to_mindspore(torch.randn(4, 6, 16))

    def outputs(run):
        out = run(x)
        return [o.asnumpy() for o in (out if isinstance(out, tuple) else (out,))]

    def loss_of(run):
        def loss(a):
            out = run(a)
            return (out[0] if isinstance(out, tuple) else out).sum()
        return loss

    want = outputs(cell)
    got = outputs(par)
    assert len(got) == len(want) == (2 if make == "gpt_oss" else 1)
    for g, expected in zip(got, want):
        np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max())
    moe = cell.moe.moe
    params = [moe.router.weight, moe.experts.w_gate, moe.experts.w_down]
    want_grads = ms.grad(loss_of(cell), None, params)(x)
    got_grads = ms.grad(loss_of(par), None, params)(x)
    for got, expected in zip(got_grads, want_grads):
        expected = expected.asnumpy()
        # float32 sums in another order (over the devices' tokens): 1e-4 relative, a floor near zero
        np.testing.assert_allclose(got.asnumpy(), expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())
    assert moe.parallel().last_stats["rows"] > 0  # the experts ran expert parallel


def _decorated_experts(apply_gate=None):
    """An experts class decorated by transformers' use_experts_implementation (up_proj (E, in, out), no gate,
    squared ReLU: Ergo's and Nemotron-H's layout), dispatched to grouped_mm (torch.histc offsets) by its config."""
    from transformers import PretrainedConfig
    from transformers.integrations.moe import use_experts_implementation

    class SquaredReluExperts(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.num_experts = 4
            self.up_proj = torch.nn.Parameter(torch.randn(4, 8, 12) * 0.3)
            self.down_proj = torch.nn.Parameter(torch.randn(4, 12, 8) * 0.3)
            self.act_fn = lambda x: torch.relu(x) ** 2

        def forward(self, hidden_states, top_k_index, top_k_weights):  # "eager": never selected here
            raise NotImplementedError

    flags = dict(has_gate=False, is_transposed=True)
    if apply_gate is not None:  # a gated variant whose gate only works on 2-D inputs
        flags = dict(has_gate=True, is_transposed=True)
        SquaredReluExperts._apply_gate = apply_gate
    cls = use_experts_implementation(SquaredReluExperts, **flags)
    config = PretrainedConfig()
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    experts = cls(config)
    if apply_gate is not None:
        experts.gate_up_proj = torch.nn.Parameter(torch.randn(4, 8, 24) * 0.3)
        del experts.up_proj
    return experts


class RoutedExperts(torch.nn.Module):
    """A softmax top-2 router in front of an experts module called as transformers' blocks call it."""

    def __init__(self, experts):
        super().__init__()
        self.router = torch.nn.Linear(8, 4, bias=False)
        self.experts = experts

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        weights, index = torch.topk(torch.softmax(self.router(flat), -1), 2, dim=-1)
        return self.experts(flat, index, weights).reshape(x.shape)


def test_grouped_mm_experts_are_computed_densely_with_torch_gradients():
    """The grouped_mm path (aten.histc) is replaced, after checking it on the example, by the dense formulation
    through the decorator's flags; forward and the experts' gradient equal torch's at another shape."""
    model = RoutedExperts(_decorated_experts())
    cell, report = convert(model, torch.randn(2, 5, 8))
    assert any("'grouped_mm' replaced by the dense formulation" in n for n in report.notes), report.notes
    x, weights = torch.randn(3, 7, 8), torch.randn(3, 7, 8)
    assert_same_outputs(cell, model, x)
    (model(x) * weights).sum().backward()
    up = next(p for n, p in cell.parameters_and_names() if n.endswith("experts.up_proj"))
    grads = ms.grad(lambda a: (cell(a) * to_mindspore(weights)).sum(), None, [up])(to_mindspore(x))
    want = model.experts.up_proj.grad.numpy()
    # float32 sums of <= 21 tokens x 8 products on both sides: 1e-5 of the largest entry is far above rounding
    assert np.abs(grads[0].asnumpy() - want).max() <= 1e-5 * np.abs(want).max()


def test_experts_whose_dense_formulation_differs_keep_their_path_and_fail_by_name():
    """A gate written for 2-D inputs only (it slices dimension 1) is not what the dense formulation computes on
    [E, T, 2F]: the module keeps grouped_mm, whose aten.histc is refused by name."""
    from mindspore_hyper.migrate.errors import UnsupportedOpError

    def two_d_gate(self, gate_up):
        return torch.relu(gate_up[:, :12]) * gate_up[:, 12:]
    model = RoutedExperts(_decorated_experts(two_d_gate))
    with pytest.raises(UnsupportedOpError, match="aten.histc"):
        convert(model, torch.randn(2, 5, 8))
