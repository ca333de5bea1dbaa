"""examples/mla_attention.py: multi-head latent attention against a numpy reference, its refusals,
and DeepSeek-V3's layer mix (MLA, dense layers first, then MoE) dry-run equal to the simulation."""
import os
import sys

import numpy as np
import pytest
from mindspore import Tensor, nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples"))
from mla_attention import MLAttention  # noqa: E402
from moe_lm import MoELM, deepseek_v3, moe_strategy  # noqa: E402

pytestmark = pytest.mark.usefixtures("pynative")


def _reference(cell: MLAttention, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The module docstring's equations in float64 numpy, from the Cell's weights."""
    w = {p.name.split(".")[-2] + "." + p.name.split(".")[-1]: p.asnumpy().astype(np.float64)
         for p in cell.get_parameters()}

    def dense(v, name):
        return v @ w[name + ".weight"].T  # nn.Dense: weight [out, in]

    def rms(v, name):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-6) * w[name + ".weight"]

    def rope(v):
        half, t, dim = v.shape[-1] // 2, v.shape[-2], v.shape[-1]
        angle = np.arange(t)[:, None] * 10000.0 ** (-np.arange(0, dim, 2) / dim)[None, :]
        cos, sin = np.cos(np.concatenate([angle] * 2, -1)), np.sin(np.concatenate([angle] * 2, -1))
        return v * cos + np.concatenate([-v[..., half:], v[..., :half]], -1) * sin

    b, t, _ = x.shape
    h, dn, dr, dv = cell.heads, cell.nope, cell.rope, cell.v_dim
    q = dense(rms(dense(x, "q_a"), "q_norm"), "q_b").reshape(b, t, h, dn + dr).transpose(0, 2, 1, 3)
    kv_a = dense(x, "kv_a")
    c_kv, k_pe = kv_a[..., :cell.kv_rank], kv_a[..., cell.kv_rank:]
    kv = dense(rms(c_kv, "kv_norm"), "kv_b").reshape(b, t, h, dn + dv).transpose(0, 2, 1, 3)
    q_full = np.concatenate([q[..., :dn], rope(q[..., dn:])], -1)
    k_full = np.concatenate([kv[..., :dn], np.broadcast_to(rope(k_pe)[:, None], (b, h, t, dr))], -1)
    scores = q_full @ k_full.swapaxes(-1, -2) / np.sqrt(dn + dr) + mask
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = (probs @ kv[..., dn:]).transpose(0, 2, 1, 3).reshape(b, t, h * dv)
    return dense(ctx, "o")


def test_mla_forward_equals_numpy():
    """Tiny sizes (hidden 16, 2 heads, latents 8 and 6, nope 4, rope 4, value 3, 5 positions) with
    a causal mask, against float64 numpy. Tolerance: float32 rounding (eps 1.2e-7) through six
    chained products of at most 16 terms each plus a softmax, about 6 x 16 x eps = 1.2e-5 of the
    output's scale, so rtol 2e-5 and atol 2e-5 x max |out|."""
    cell = MLAttention(16, 2, q_lora_rank=8, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=3,
                       seq=5)
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    mask = np.triu(np.full((5, 5), -1e9, np.float32), 1)
    got = cell(Tensor(x), Tensor(mask)).asnumpy()
    want = _reference(cell, x.astype(np.float64), mask.astype(np.float64))
    assert got.shape == (2, 5, 16)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_mla_refuses_bad_sizes():
    with pytest.raises(ValueError, match="MLAttention: qk_rope_head_dim=3; expected an even width"):
        MLAttention(16, 2, 8, 6, 4, 3, 3, 5)
    with pytest.raises(ValueError, match="MLAttention: heads=0; expected an int >= 1"):
        MLAttention(16, 0, 8, 6, 4, 4, 3, 5)
    with pytest.raises(ValueError, match=r"MoELM: dense_layers=3 must be in 0..layers=2"):
        MoELM(layers=2, dense_layers=3, dense_ffn=8)


def test_deepseek_v3_as_published_has_671b_parameters():
    """MoELM at deepseek_v3(): 671.03 B parameters (DeepSeek-V3's 671 B without its multi-token
    prediction module), counted from shapes under no_init_parameters."""
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():
        net = MoELM(**deepseek_v3())
    assert round(sum(int(np.prod(p.shape)) for p in net.get_parameters()) / 1e9, 2) == 671.03
    assert type(net.blocks[2].attn).__name__ == "MLAttention" and hasattr(net.blocks[2], "mlp")
    assert hasattr(net.blocks[3], "moe")


def test_mla_and_dense_layers_dry_run_equal_the_simulation(pynative):
    """DeepSeek-V3's layer mix at tiny size (MLA, one dense layer then one MoE layer) on
    pipeline 2 x expert 2 (the dense layer one stage, the MoE layer the other), 1F1B over 2
    microbatches, balanced routing: memory, collectives, sends and step series equal."""
    mh = pynative
    ids = Tensor(np.random.default_rng(1).integers(0, 32, (4, 8)).astype(np.int32))
    reports = []
    for mode in ("simulation", "dryrun"):
        mh.set_context(mode=mode, device_num=4, moe_routing="balanced")
        net = MoELM(vocab=32, hidden=8, heads=2, layers=2, seq=8, experts=4, top_k=2, expert_ffn=8, shared_ffn=8,
                    mla=dict(q_lora_rank=6, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2),
                    dense_layers=1, dense_ffn=12)
        model = mh.auto_parallelize(net, moe_strategy(1, 2, 2), pipeline={"schedule": "1f1b", "microbatches": 2})
        optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
        model.train_step(optimizer, ids, ids)
        reports.append(model.report(optimizer))
    sim, dry = reports
    assert sim.memory == dry.memory and sim.comm == dry.comm and sim.comm_backward == dry.comm_backward
    assert sim.p2p == dry.p2p and sim.comm_causes == dry.comm_causes and sim.step_memory == dry.step_memory
    assert "expert@stage1" in dry.comm["AllToAll"] and "expert@stage0" not in dry.comm.get("AllToAll", {})
