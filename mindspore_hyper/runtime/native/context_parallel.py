"""Context parallelism in native mode: what MindSpore 2.10 has, and why the translation refuses.

MindSpore 2.10's semi-auto parallel has context parallelism only inside the `FlashAttentionScore`
primitive: a shard strategy that splits the query's sequence dimension, with the primitive
attributes `enable_ring_attention` (ring attention: its `overlap_grad_ring_attention` pass and
`RingAttentionUpdate`) or `enable_flash_sp`. It has no Ulysses option (MindFormers builds Ulysses
from AllToAll ops in model code). The translation derives every strategy from running the model
once in simulation on CPU, where `FlashAttentionScore` has no kernel, and the models it runs
(the examples' GPT, `nn.MultiheadAttention`, converted models) build attention from MatMul and
Softmax ops, which MindSpore cannot run as ring attention. So native mode refuses a strategy
with `context_parallel` and says so; simulation and msrun run it (docs/context_parallel.md).
"""
from __future__ import annotations

from mindspore import nn
from mindspore.ops.auto_generate.gen_ops_prim import FlashAttentionScore

from mindspore_hyper.shard.context_parallel_spec import ContextParallel

__all__ = ["refusal"]


def _flash_attention_primitives(model: nn.Cell) -> int:
    count = 0
    for _, cell in model.cells_and_names():
        count += sum(isinstance(v, FlashAttentionScore) for v in vars(cell).values())
    return count


def refusal(model: nn.Cell, context: ContextParallel) -> str:
    """Why native mode cannot translate `context` for `model` (the ValueError's message)."""
    head = (f"native mode: context_parallel={context.axis!r} (method {context.method!r}) cannot be translated: "
            "MindSpore 2.10 has context parallelism only inside FlashAttentionScore (a shard strategy splitting "
            "the query's sequence dimension with the primitive attribute enable_ring_attention or enable_flash_sp)")
    if context.method == "ulysses":
        head += " and no Ulysses option"
    found = _flash_attention_primitives(model)
    if found:
        why = (f"; the model's {found} FlashAttentionScore primitive(s) have no CPU kernel, so the translation "
               "cannot run the model in simulation to derive the other primitives' strategies")
    else:
        why = "; the model's attention is built from MatMul/Softmax ops, which MindSpore cannot run as ring attention"
    return head + why + ". Run it with mode='simulation' or under msrun (mode='distributed')."
