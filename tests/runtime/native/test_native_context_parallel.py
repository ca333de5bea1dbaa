"""Native mode refuses context parallelism plainly, naming what MindSpore 2.10 has instead."""
import sys

import pytest
from mindspore import nn
from mindspore.ops.auto_generate.gen_ops_prim import FlashAttentionScore

from mindspore_hyper.runtime.native.translate import apply_native
from mindspore_hyper.shard import Layout
from mindspore_hyper.strategy.resolve import resolve_strategy

from paths import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
from models import GPT  # noqa: E402  examples/models.py

MESH = Layout((2, 2), ("data", "cp"))


@pytest.mark.parametrize("method", ["ring", "ulysses"])
def test_native_mode_refuses_context_parallel(method):
    model = GPT(vocab=16, hidden=8, heads=2, layers=1, seq=8)
    table = resolve_strategy(model, MESH(tensor_map=(), context_parallel="cp", context_method=method))
    with pytest.raises(ValueError) as info:
        apply_native(model, table, example_inputs=())
    text = str(info.value)
    assert "context_parallel='cp'" in text and "FlashAttentionScore" in text and "enable_ring_attention" in text
    assert "built from MatMul/Softmax" in text and "mode='simulation'" in text
    assert ("no Ulysses option" in text) == (method == "ulysses")


def test_native_refusal_names_flash_attention_primitives():
    class Flash(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(8, 8)
            self.attention = FlashAttentionScore(head_num=2, input_layout="BSH")

        def construct(self, x):
            x = self.dense(x)
            return self.attention(x, x, x)[3]

    model = Flash()
    table = resolve_strategy(model, MESH(tensor_map=(), context_parallel="cp"))
    with pytest.raises(ValueError, match=r"1 FlashAttentionScore primitive\(s\) have no CPU kernel"):
        apply_native(model, table, example_inputs=())
