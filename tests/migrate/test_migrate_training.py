"""Converted (structure="modules") Cells train like their torch originals: 5 AdamW steps from the same
weights on batches of changing shapes give the same losses and parameters (<= 1e-4 relative) for
GPT-2, Llama (GQA + RoPE), BERT, ViT and T5 (sequences up to 40: log-based position buckets)."""
import numpy as np
import pytest
import torch
import mindspore as ms
from mindspore import mint, ops

from mindspore_hyper.migrate import convert

from migrate_models import gpt2
from migrate_training import max_parameter_error, next_token_loss_ms, next_token_loss_torch, train_both

pytestmark = pytest.mark.usefixtures("pynative")
REL = 1e-4


def first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def token_batches(lengths, decoder=False):
    torch.manual_seed(1)
    return [tuple(torch.randint(0, 101, (2, n - k)) for k in ((0, 3) if decoder else (0,))) for n in lengths]


def lm_losses():
    return (lambda out, b: next_token_loss_torch(out.logits, b[0]),
            lambda out, b: next_token_loss_ms(first(out), b[0]))


class Seq2Seq(torch.nn.Module):
    """T5 called with (input_ids, decoder_input_ids) positionally (its forward's second parameter is the mask)."""

    def __init__(self, t5):
        super().__init__()
        self.t5 = t5

    def forward(self, input_ids, decoder_input_ids):
        return self.t5(input_ids=input_ids, decoder_input_ids=decoder_input_ids)


def build(name):
    torch.manual_seed(0)
    if name == "gpt2":
        return gpt2(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), token_batches([9, 12, 10, 14, 11]), lm_losses()
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                             max_position_embeddings=64, use_cache=False))
        return model, token_batches([9, 12, 10, 14, 11]), lm_losses()
    if name == "bert":
        from transformers import BertConfig, BertForMaskedLM

        model = BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=64, vocab_size=101, max_position_embeddings=32,
                                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        return model, token_batches([9, 12, 10, 14, 11]), lm_losses()
    if name == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        # lengths past 16 and 32: T5's relative-position buckets of distances >= 16 are log-based and
        # truncated to integers (the converted log must round like torch's)
        model = Seq2Seq(T5ForConditionalGeneration(T5Config(vocab_size=101, d_model=32, d_kv=8, d_ff=64,
                                                            num_layers=2, num_heads=4, use_cache=False,
                                                            decoder_start_token_id=0, dropout_rate=0.0)))
        return model, token_batches([9, 21, 10, 40, 11], decoder=True), (
            lambda out, b: next_token_loss_torch(out.logits, b[1]),
            lambda out, b: next_token_loss_ms(first(out), b[1]))
    from transformers import ViTConfig, ViTForImageClassification

    model = ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                intermediate_size=64, image_size=16, patch_size=4, num_channels=3,
                                                num_labels=5, hidden_dropout_prob=0.0,
                                                attention_probs_dropout_prob=0.0))
    torch.manual_seed(1)
    batches = [(torch.randn(n, 3, 16, 16),) for n in (2, 3, 2, 4, 3)]

    def torch_loss(out, b):  # image i of a batch has label i % 5
        return torch.nn.functional.cross_entropy(out.logits, torch.arange(b[0].shape[0]) % 5)

    def ms_loss(out, b):
        labels = ms.Tensor((np.arange(b[0].shape[0]) % 5).reshape(-1, 1))
        return mint.neg(mint.mean(mint.gather(ops.log_softmax(first(out), -1), 1, labels)))
    return model, batches, (torch_loss, ms_loss)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "vit", "t5"])
def test_five_adamw_steps_equal_torch(name):
    model, batches, (torch_loss, ms_loss) = build(name)
    model.train()
    cell, report = convert(model, batches[0], structure="modules")
    if name == "t5":  # block 0 computes the relative position bias blocks 1.. reuse: the blocks differ
        assert {c["class"] for c in report.classes} >= {"T5Block", "T5Block2", "T5Attention", "T5LayerNorm"}
    else:
        assert report.loops, "the layers are called in a loop"
    torch_losses, ms_losses = train_both(model, cell, batches, torch_loss, ms_loss)
    for step, (want, got) in enumerate(zip(torch_losses, ms_losses)):
        assert abs(got - want) <= REL * abs(want), (step, torch_losses, ms_losses)
    assert max_parameter_error(model, cell) <= REL
