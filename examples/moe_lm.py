"""A DeepSeek-style MoE language model from the package's parts: attention blocks whose
feed-forward is an `MoE` (routed experts, top-k, one shared expert), and its expert-parallel
strategy (experts split over an "expert" axis, tokens over data x expert, ZeRO-1 over data).

    mindspore-hyper dryrun --devices 2048 --hardware ascend-910c examples/moe_lm.py \\
        --layers 61 --hidden 7168 --heads 128 --experts 256 --top-k 8 --expert-ffn 2048 --data 32 --expert 64
    mindspore-hyper run --devices 8 examples/moe_lm.py          # tiny, values computed

By default standard multi-head attention and every layer MoE; `deepseek_v3()` gives DeepSeek-V3 as
published: multi-head latent attention (`mla_attention.MLAttention`), the first 3 layers dense
(a SwiGLU MLP of 18432), the other 58 MoE (256 routed experts of 2048, top-8, one shared), vocabulary
129280, hidden 7168, 61 layers: 671B parameters (`benchmarks/bench_dryrun.py` dry-runs it). Its norms are LayerNorms
(DeepSeek's RMSNorm has no bias: 2 x 7168 parameters a norm fewer) and its router has no
group-limited selection or bias term.
"""
import argparse
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn
from mindspore.nn.utils import no_init_parameters

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper.moe import MoE, SharedExpert  # noqa: E402
from mindspore_hyper.pipeline.aux_loss import AuxLosses, add_aux_loss  # noqa: E402
from mla_attention import MLAttention  # noqa: E402
from models import Attention, EmbedLayer, HeadLayer, MaskedBlock, float32_logits  # noqa: E402


class MoEBlock(nn.Cell):
    def __init__(self, hidden, attention, experts, top_k, expert_ffn, shared_ffn):
        super().__init__()
        self.ln1 = nn.LayerNorm((hidden,))
        self.attn = attention
        self.ln2 = nn.LayerNorm((hidden,))
        self.moe = MoE(hidden, expert_ffn, num_experts=experts, top_k=top_k, shared_ffn_hidden=shared_ffn)

    def construct(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        y, aux = self.moe(self.ln2(x))
        add_aux_loss(aux, "MoEBlock")  # a pipeline stage passes one tensor on: the term goes aside
        return x + y


class DenseBlock(nn.Cell):
    """DeepSeek-V3's first layers: attention, then a SwiGLU MLP (the shared expert's form)."""

    def __init__(self, hidden, attention, ffn):
        super().__init__()
        self.ln1 = nn.LayerNorm((hidden,))
        self.attn = attention
        self.ln2 = nn.LayerNorm((hidden,))
        self.mlp = SharedExpert(hidden, ffn)

    def construct(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


def deepseek_v3(layers: int = 61, seq: int = 4096) -> dict:
    """MoELM's arguments for DeepSeek-V3 as published (its config.json): MLA, 3 dense layers first."""
    return dict(vocab=129280, hidden=7168, heads=128, layers=layers, seq=seq, experts=256, top_k=8, expert_ffn=2048,
                shared_ffn=2048, mla=dict(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                                          qk_rope_head_dim=64, v_head_dim=128),
                dense_layers=min(3, layers), dense_ffn=18432)


class MoELM(nn.Cell):
    """Embedding, blocks, LM head; returns cross-entropy plus the routers' auxiliary losses.

    Args:
        mla: multi-head latent attention's sizes (`MLAttention`'s keywords besides hidden, heads
            and seq); None: standard multi-head attention.
        dense_layers: the first layers whose feed-forward is a dense SwiGLU MLP of `dense_ffn`
            instead of the MoE.
    """

    def __init__(self, vocab=128, hidden=32, heads=4, layers=2, seq=16, experts=8, top_k=2, expert_ffn=32,
                 shared_ffn=32, mla=None, dense_layers=0, dense_ffn=0):
        super().__init__()
        if not 0 <= dense_layers <= layers or (dense_layers and dense_ffn < 1):
            raise ValueError(f"MoELM: dense_layers={dense_layers} must be in 0..layers={layers}, with dense_ffn >= 1 "
                             f"(got {dense_ffn})")

        def attention():
            return Attention(hidden, heads) if mla is None else MLAttention(hidden, heads, seq=seq, **mla)

        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.CellList([DenseBlock(hidden, attention(), dense_ffn) if i < dense_layers else
                                   MoEBlock(hidden, attention(), experts, top_k, expert_ffn, shared_ffn)
                                   for i in range(layers)])
        self.ln_f = nn.LayerNorm((hidden,))
        self.head = nn.Dense(hidden, vocab, has_bias=False)
        self.loss = nn.CrossEntropyLoss()
        self.mask = Tensor(np.triu(np.full((seq, seq), -1e9, np.float32), 1))

    def pipeline_layers(self):
        """The chain of layers a pipeline cuts into stages (no traced forward needed)."""
        return [EmbedLayer(self.embed)] + [MaskedBlock(b, self.mask) for b in self.blocks] + \
            [HeadLayer(self.ln_f, self.head)]

    def pipeline_loss(self, logits, labels):
        b, t, v = logits.shape
        return self.loss(float32_logits(logits).reshape(b * t, v), labels.reshape(b * t))

    def construct(self, ids, labels):
        with AuxLosses() as aux:  # the routers' terms (a pipeline's stages collect their own)
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x, self.mask)
            logits = self.head(self.ln_f(x))
            b, t, v = logits.shape
            loss = self.loss(float32_logits(logits).reshape(b * t, v), labels.reshape(b * t))
        return loss + aux.total() if aux else loss


def moe_strategy(data: int, expert: int, pipeline: int = 1):
    """Experts split over "expert"; tokens over data x expert; ZeRO-1 over data; with `pipeline`
    > 1 a "pipeline" axis too (the blocks cut into that many stages)."""
    mesh = mh.Layout((data, pipeline, expert), ("data", "pipeline", "expert")) if pipeline > 1 else \
        mh.Layout((data, expert), ("data", "expert"))
    strategy = mesh(tensor_map=(), input_map=(("data", "expert"),), optimizer_state="data")
    return strategy.override("*.moe.experts.*", "expert")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("layers", 2), ("hidden", 32), ("heads", 4), ("seq", 16), ("vocab", 128), ("experts", 8),
                          ("top-k", 2), ("expert-ffn", 32), ("shared-ffn", 32), ("data", 2), ("expert", 4),
                          ("pipeline", 1), ("microbatches", 4)):
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    with no_init_parameters():
        net = MoELM(args.vocab, args.hidden, args.heads, args.layers, args.seq, args.experts, args.top_k,
                    args.expert_ffn, args.shared_ffn)
        strategy = moe_strategy(args.data, args.expert, args.pipeline)
        if args.pipeline > 1:
            model = mh.auto_parallelize(net, strategy, pipeline={"schedule": "1f1b", "microbatches": args.microbatches})
        else:
            model = mh.auto_parallelize(net, strategy)
        optimizer = nn.AdamWeightDecay(model.optimizer_parameters(), 1e-4)
    batch = args.data * args.expert * (args.microbatches if args.pipeline > 1 else 1)
    ids = Tensor(np.random.default_rng(0).integers(0, args.vocab, (batch, args.seq)).astype(np.int32))
    model.train_step(optimizer, ids, ids)


if __name__ == "__main__":
    main()
