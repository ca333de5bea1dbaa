"""TransformerConfig: the shape of a decoder-only transformer, and its parameter counts per piece.

Counts are split by how tensor parallelism (Megatron-style) treats each parameter: column- and
row-parallel weights, column-parallel biases, the vocabulary-parallel embedding and output
projection are divided by the tensor-parallel size; row-parallel biases, norms and the
position table are replicated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from mindspore_hyper.estimate._checks import check_bool, check_choice, check_int
from mindspore_hyper.estimate._record import Record

__all__ = ["TransformerConfig", "ParamCounts", "PRESETS", "preset", "NORMS"]

NORMS = ("layernorm", "rmsnorm")
ELEMENT_BYTES = (1, 2, 4, 8)


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts (elements) of one piece of the model.

    Attributes:
        split: divided by the tensor-parallel size (weights, column-parallel biases, vocabulary).
        replicated: kept whole on every tensor-parallel rank (norms, row-parallel biases).
        kv: key/value projections (weights and biases), divided by min(t, kv_heads): with more
            tensor-parallel ranks than key/value heads each head is replicated.
        experts: parameters of the MoE experts, divided by the expert- and tensor-parallel sizes.
    """

    split: int = 0
    replicated: int = 0
    kv: int = 0
    experts: int = 0

    @property
    def total(self) -> int:
        return self.split + self.replicated + self.kv + self.experts

    def __add__(self, other: "ParamCounts") -> "ParamCounts":
        return ParamCounts(self.split + other.split, self.replicated + other.replicated, self.kv + other.kv,
                           self.experts + other.experts)

    def __mul__(self, n: int) -> "ParamCounts":
        return ParamCounts(self.split * n, self.replicated * n, self.kv * n, self.experts * n)


@dataclass(frozen=True)
class TransformerConfig(Record):
    """A decoder-only transformer and one micro-batch of its input.

    Args:
        layers: transformer layers.
        hidden: hidden size h.
        heads: attention heads a (h must divide by a).
        vocab: vocabulary size.
        seq_len: sequence length s (tokens per sequence).
        micro_batch: sequences per micro-batch on one data-parallel rank.
        ffn: MLP width (default 4 * hidden).
        kv_heads: key/value heads (grouped-query attention; default = heads).
        dtype_bytes: element size of parameters, gradients and activations (2 = bf16/fp16).
        experts: MoE experts per layer replacing the MLP (0 = dense); a router of hidden x
            experts is added.
        bias: linear layers have biases (the LM head never has one).
        norm: "layernorm" (gamma and beta) or "rmsnorm" (gamma only).
        gated_mlp: gated MLP (SwiGLU: gate, up, down projections) instead of up, down.
        learned_positions: a learned position table of seq_len rows (False: rotary, no parameters).
        tied_embeddings: the LM head reuses the embedding table.
        top_k: MoE experts each token is routed to (the step-time model's expert FLOPs and
            AllToAll bytes; parameters do not depend on it). Must be <= experts.

    Raises:
        ValueError: a field of the wrong type or out of range (named in the message).
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    micro_batch: int = 1
    ffn: Optional[int] = None
    kv_heads: Optional[int] = None
    dtype_bytes: int = 2
    experts: int = 0
    bias: bool = True
    norm: str = "layernorm"
    gated_mlp: bool = False
    learned_positions: bool = True
    tied_embeddings: bool = False
    top_k: int = 1

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "vocab", "seq_len", "micro_batch"):
            check_int(name, getattr(self, name), 1)
        if self.ffn is None:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        check_int("ffn", self.ffn, 1)
        check_int("kv_heads", self.kv_heads, 1)
        check_int("experts", self.experts, 0)
        check_int("top_k", self.top_k, 1)
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k}: more than the experts ({self.experts})")
        check_int("dtype_bytes", self.dtype_bytes, 1)
        check_choice("dtype_bytes", self.dtype_bytes, ELEMENT_BYTES)
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must divide by heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must divide by kv_heads={self.kv_heads}")
        check_choice("norm", self.norm, NORMS)
        for name in ("bias", "gated_mlp", "learned_positions", "tied_embeddings"):
            check_bool(name, getattr(self, name))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    # -- parameter counts ----------------------------------------------------------------------
    def _norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def _mlp_params(self) -> ParamCounts:
        h, f, bias = self.hidden, self.ffn, self.bias
        column = 2 if self.gated_mlp else 1  # up (and gate) projections: column parallel; down: row parallel
        return ParamCounts(split=column * (h * f + (f if bias else 0)) + f * h, replicated=h if bias else 0)

    def layer_params(self) -> ParamCounts:
        """One transformer layer: two norms, attention (q, k, v, output projection), MLP or experts."""
        h, bias = self.hidden, self.bias
        kv_dim = self.kv_heads * self.head_dim
        attention = ParamCounts(split=h * h + (h if bias else 0) + h * h, replicated=h if bias else 0,
                                kv=2 * (h * kv_dim + (kv_dim if bias else 0)))
        norms = ParamCounts(replicated=2 * self._norm_params())
        if self.experts:
            mlp = self._mlp_params()
            return attention + norms + ParamCounts(replicated=h * self.experts, experts=self.experts * mlp.total)
        return attention + norms + self._mlp_params()

    def embedding_params(self) -> ParamCounts:
        """Token embedding (vocabulary parallel) and the position table (replicated)."""
        positions = self.seq_len * self.hidden if self.learned_positions else 0
        return ParamCounts(split=self.vocab * self.hidden, replicated=positions)

    def head_params(self, separate_copy: bool = False) -> ParamCounts:
        """Final norm and LM head; a tied head counts only when it is a separate copy (the last
        pipeline stage of a tied model keeps one, as Megatron does)."""
        head = self.vocab * self.hidden if (not self.tied_embeddings or separate_copy) else 0
        return ParamCounts(split=head, replicated=self._norm_params())

    def total_params(self) -> int:
        """All parameters of the model (a tied embedding counted once)."""
        return (self.embedding_params() + self.layer_params() * self.layers + self.head_params()).total

    def largest_layer_params(self) -> int:
        """The largest single piece: a transformer layer, the embedding or the LM head (the
        "layer" DeepSpeed's ZeRO-3 estimator gathers at once)."""
        return max(self.layer_params().total, self.vocab * self.hidden)


PRESETS: Dict[str, TransformerConfig] = {
    # examples/models.py GPT(vocab=128, hidden=64, heads=4, layers=2, seq=16), float32, batch 8
    "gpt-example": TransformerConfig(layers=2, hidden=64, heads=4, vocab=128, seq_len=16, micro_batch=8,
                                     dtype_bytes=4),
    # GPT-3 175B as in Korthikanti et al. 2022, Table 3
    "gpt3-175b": TransformerConfig(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048, micro_batch=1),
    # Llama-2-7B shape: RMSNorm, SwiGLU MLP of 11008, rotary positions, no biases, untied head
    "llama2-7b": TransformerConfig(layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, micro_batch=1,
                                   ffn=11008, bias=False, norm="rmsnorm", gated_mlp=True, learned_positions=False),
    # Llama-2-70B shape: as 7B with 80 layers, hidden 8192, 64 heads, 8 key/value heads, MLP 28672
    "llama2-70b": TransformerConfig(layers=80, hidden=8192, heads=64, vocab=32000, seq_len=4096, micro_batch=1,
                                    ffn=28672, kv_heads=8, bias=False, norm="rmsnorm", gated_mlp=True,
                                    learned_positions=False),
}


def preset(name: str) -> TransformerConfig:
    """A named configuration from PRESETS.

    Raises:
        ValueError: unknown name (the known ones are listed).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; expected one of {', '.join(PRESETS)}")
    return PRESETS[name]
