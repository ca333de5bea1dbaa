"""tensor_parallel_plan: Megatron column/row splits on the torch names, from transformers' tp_plan (Llama) or from
the name rules (BERT, GPT-2's Conv1D, T5's encoder-decoder), and its refusals. The plans run under auto_parallelize
in the sweep (test_migrate_sweep.py: one step of the converted model on a 2 x 2 data x tensor mesh against one
device); here only the plans themselves, exact."""
import pytest
import torch

from mindspore_hyper.migrate import TensorPlan, tensor_parallel_plan


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=64))


def _splits(plan: TensorPlan):
    return [(e["name"], e["strategy"]["tensor"]) for e in plan.module_level]


def _biases(plan: TensorPlan):
    return [(e["name"], e["tensor_map"]) for e in plan.parameter_level]


def test_llama_from_transformers_tp_plan():
    plan = tensor_parallel_plan(_llama(), prefix="m.")
    assert plan.source == "transformers tp_plan" and plan.tensor == 2
    layer = "m.model.layers.*."  # the plan's keys are relative to the base model, `model.`
    assert _splits(plan) == [(layer + "self_attn.q_proj", (2, 1)), (layer + "self_attn.k_proj", (2, 1)),
                             (layer + "self_attn.v_proj", (2, 1)), (layer + "self_attn.o_proj", (1, 2)),
                             (layer + "mlp.gate_proj", (2, 1)), (layer + "mlp.up_proj", (2, 1)),
                             (layer + "mlp.down_proj", (1, 2))]
    assert plan.parameter_level == () and plan.replicated == ()  # no biases; every style has a Linear split
    config = plan.parallel_config(data=2)["parallel_config"]
    assert config["device_matrix"] == [2, 2] and config["alias_names"] == ["data", "tensor"]
    assert "  - {name: \"m.model.layers.*.mlp.down_proj\", strategy: {tensor: (1, 2)}}" in plan.to_yaml()


def test_tp_plan_styles_without_a_linear_split_are_listed():
    model = _llama()
    model.config.base_model_tp_plan = {"embed_tokens": "embedding_rowwise", "layers.*.self_attn.q_proj": "colwise",
                                       "layers.*.nothing": "rowwise", "norm": "colwise"}
    plan = tensor_parallel_plan(model)
    assert _splits(plan) == [("model.layers.*.self_attn.q_proj", (2, 1))]
    assert plan.replicated == (
        ("model.embed_tokens", "embedding_rowwise: an embedding (vocabulary-parallel lookup is not planned)"),
        ("model.layers.*.nothing", "rowwise: matches no module"),
        ("model.norm", "colwise: matches no Linear (LlamaRMSNorm)"))


def test_a_tp_plan_naming_only_the_embedding_falls_back_to_the_name_rules():
    """DiffLlama's, gpt-oss's and LFM2's base_model_tp_plan name only `embed_tokens`: the name rules split the
    layers, and the plan's entry is listed as left whole."""
    model = _llama()
    model.config.base_model_tp_plan = {"embed_tokens": "embedding_rowwise"}
    plan = tensor_parallel_plan(model)
    assert plan.source == "module names"
    attn = "model.layers.*.self_attn."
    assert _splits(plan) == [(attn + "q_proj", (2, 1)), (attn + "k_proj", (2, 1)), (attn + "v_proj", (2, 1)),
                             (attn + "o_proj", (1, 2)), ("model.layers.*.mlp.gate_proj", (2, 1)),
                             ("model.layers.*.mlp.up_proj", (2, 1)), ("model.layers.*.mlp.down_proj", (1, 2))]
    assert plan.replicated == (("model.embed_tokens", "embedding_rowwise: an embedding (vocabulary-parallel lookup "
                                                      "is not planned) (transformers tp_plan, which splits no Linear "
                                                      "here)"),)


def test_the_base_model_is_found_where_the_stated_prefix_is_no_submodule():
    """Llama 4's causal LM states base_model_prefix `language_model` but holds its layers under `model`: the plan's
    keys are resolved against the child whose names they match."""
    model = _llama()
    model.base_model_prefix = "language_model"
    plan = tensor_parallel_plan(model)
    assert plan.source == "transformers tp_plan" and _splits(plan)[0] == ("model.layers.*.self_attn.q_proj", (2, 1))


def test_bert_by_module_names():
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, vocab_size=64))
    plan = tensor_parallel_plan(model)
    assert plan.source == "module names"
    layer = "bert.encoder.layer.*."
    column, row = ["tensor"], [None]
    assert _splits(plan) == [(layer + "attention.self.query", (2, 1)), (layer + "attention.self.key", (2, 1)),
                             (layer + "attention.self.value", (2, 1)), (layer + "attention.output.dense", (1, 2)),
                             (layer + "intermediate.dense", (2, 1)), (layer + "output.dense", (1, 2))]
    assert _biases(plan) == [(layer + "attention.self.query.bias", column), (layer + "attention.self.key.bias", column),
                             (layer + "attention.self.value.bias", column),
                             (layer + "attention.output.dense.bias", row), (layer + "intermediate.dense.bias", column),
                             (layer + "output.dense.bias", row)]
    assert plan.replicated == ()  # the MLM head's dense is outside the layer list: not considered


def test_gpt2_conv1d_weights_are_in_by_out():
    from transformers import GPT2Config, GPT2LMHeadModel

    plan = tensor_parallel_plan(GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64)))
    h = "transformer.h.*."
    # Conv1D's weight is (in, out): column-parallel splits its second dimension, row-parallel its first
    assert _splits(plan) == [(h + "attn.c_attn", (1, 2)), (h + "attn.c_proj", (2, 1)), (h + "mlp.c_fc", (1, 2)),
                             (h + "mlp.c_proj", (2, 1))]
    assert _biases(plan) == [(h + "attn.c_attn.bias", ["tensor"]), (h + "attn.c_proj.bias", [None]),
                             (h + "mlp.c_fc.bias", ["tensor"]), (h + "mlp.c_proj.bias", [None])]


def test_t5_encoder_and_decoder_by_module_names():
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                                vocab_size=64))
    splits = dict(_splits(tensor_parallel_plan(model)))
    for stack in ("encoder", "decoder"):
        block = f"{stack}.block.*.layer.*."
        for name in ("q", "k", "v"):
            assert splits.pop(f"{block}SelfAttention.{name}") == (2, 1)
        assert splits.pop(f"{block}SelfAttention.o") == (1, 2)
        assert splits.pop(f"{block}DenseReluDense.wi") == (2, 1)
        assert splits.pop(f"{block}DenseReluDense.wo") == (1, 2)
    for name, split in (("q", (2, 1)), ("k", (2, 1)), ("v", (2, 1)), ("o", (1, 2))):
        assert splits.pop(f"decoder.block.*.layer.*.EncDecAttention.{name}") == split
    assert splits == {}


class _Block(torch.nn.Module):
    def __init__(self, odd: int):
        super().__init__()
        self.fc1, self.fc2, self.mystery = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8), torch.nn.Linear(8, 8)
        self.extra = torch.nn.Module()
        self.extra.fc1 = torch.nn.Linear(8, odd)  # a column split of `odd` outputs over 2


class _Net(torch.nn.Module):
    def __init__(self, odd: int = 5):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.blocks = torch.nn.ModuleList([_Block(odd) for _ in range(2)])


def test_unmatched_and_indivisible_linears_stay_whole_and_are_not_caught_by_a_pattern():
    plan = tensor_parallel_plan(_Net())
    assert set(plan.replicated) == {("blocks.*.mystery", "no column/row name rule matches it"),
                                    ("blocks.*.extra.fc1", "column-parallel split of 5 features by 2: not divisible")}
    # `blocks.*.fc1` (`*` crosses dots) would also split blocks.0.extra.fc1: each Linear is named instead
    assert _splits(plan) == [("blocks.0.fc1", (2, 1)), ("blocks.0.fc2", (1, 2)), ("blocks.1.fc1", (2, 1)),
                             ("blocks.1.fc2", (1, 2))]
    folded = tensor_parallel_plan(_Net(odd=6))  # extra.fc1 splits too: one pattern per role, layers folded
    assert _splits(folded) == [("blocks.*.fc1", (2, 1)), ("blocks.*.fc2", (1, 2)), ("blocks.*.extra.fc1", (2, 1))]


def test_a_net_without_linears_in_its_layer_lists_gets_an_empty_plan():
    net = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Conv2d(3, 3, 1)]), torch.nn.Linear(4, 4))
    plan = tensor_parallel_plan(net)
    assert plan.module_level == () and plan.parameter_level == () and plan.replicated == ()


def test_bad_input_is_refused_by_name():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got dict"):
        tensor_parallel_plan({"weight": torch.zeros(2, 2)})
    with pytest.raises(TypeError, match="prefix must be a str"):
        tensor_parallel_plan(_Net(), prefix=1)
    with pytest.raises(ValueError, match=r"tensor must be an int >= 2 \(the tensor-axis size\), got 1"):
        tensor_parallel_plan(_Net(), tensor=1)
    with pytest.raises(ValueError, match="data must be a positive int"):
        tensor_parallel_plan(_Net()).parallel_config(data=0)


def test_tensor_4_writes_its_split_counts():
    plan = tensor_parallel_plan(_Net(odd=8), tensor=4)
    assert _splits(plan) == [("blocks.*.fc1", (4, 1)), ("blocks.*.fc2", (1, 4)), ("blocks.*.extra.fc1", (4, 1))]
    assert plan.parallel_config(data=1)["parallel_config"]["device_matrix"] == [1, 4]


def test_linears_inside_a_block_that_becomes_moe_stay_whole_and_are_listed():
    """DeepSeek-V3: the sparse block of layer 1 converts to mindspore_hyper.moe.MoE (its shared expert becomes
    `moe.shared.*`), so the plan leaves its Linears whole and says why; layer 0's dense MLP is still split."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM(DeepseekV3Config(
        hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, vocab_size=64, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8))
    plan = tensor_parallel_plan(model, prefix="m.")
    names = [name for name, _ in _splits(plan)]
    assert not any("shared_experts" in n for n in names), names
    assert any(n.endswith("mlp.gate_proj") and "layers.0" in n or n.endswith("layers.*.mlp.gate_proj")
               for n in names), names
    assert ("m.model.layers.*.mlp.*", "inside a sparse MoE block that converts to mindspore_hyper.moe.MoE (its Cells "
            "are named otherwise: split its experts by expert parallelism, its shared expert by overrides on "
            "`moe.shared.*`)") in plan.replicated
