"""HyperParallel's `ContextParallel` style on a causal core-attention Cell: Ulysses and all-gathered
k/v equal one device (loss and every gradient), with the collectives each method implies, from
DTensor inputs and from local (rank-local) sequence shards; the cases it refuses."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.hyper_parallel import (
    ContextParallel, DTensor, Shard, distribute_module, distribute_tensor, init_device_mesh,
)
from mindspore_hyper.hyper_parallel.report import session_report

B, S, H, D = 2, 8, 4, 3  # batch, sequence, heads, head size (BSHD)
CP = 4
# The parallel attention runs the same float32 ops on the same values; only the summation order of
# the gathered/reduced gradients differs (<= CP * S terms): relative ~ CP * S * 2^-24 ~ 2e-6.
RTOL, ATOL = 1e-5, 1e-7


class CausalCore(nn.Cell):
    """softmax(q k^T / sqrt(D) + causal mask) v on BSHD inputs (written for one device)."""

    def construct(self, q, k, v):
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) / np.sqrt(D)
        n = k.shape[2]
        mask = Tensor(np.triu(np.full((n, n), -1e9, np.float32), 1))
        return ops.matmul(ops.softmax(scores + mask, -1), v).transpose(0, 2, 1, 3)


class ScaledAttention(nn.Cell):
    """q, k, v scaled per head feature (elementwise: the sequence split is kept up to the core)."""

    def __init__(self, mesh=None):
        super().__init__()
        rng = np.random.RandomState(1)
        self.wq, self.wk, self.wv, self.wo = (Parameter(Tensor(rng.randn(H, D).astype(np.float32)), name=n)
                                              for n in ("wq", "wk", "wv", "wo"))
        self.core, self.mesh = CausalCore(), mesh

    def construct(self, q, k, v):
        out = self.core(q * self.wq, k * self.wk, v * self.wv)
        if self.mesh is not None:  # the style returns the local sequence shard, as upstream does
            out = DTensor.from_local(out, self.mesh, (Shard(1),))
        loss = ((out * self.wo) ** 2).mean()
        return loss.full_tensor() if isinstance(loss, DTensor) else loss


def _inputs():
    rng = np.random.RandomState(0)
    return [rng.randn(B, S, H, D).astype(np.float32) for _ in range(3)]


def _loss_and_grads(model, inputs):
    loss, grads = ms.value_and_grad(model, None, model.trainable_params())(*inputs)
    return float(loss.asnumpy()), [g.asnumpy() for g in grads]


def _parallel(fresh_session, degree):
    fresh_session.set_context(device_num=CP)
    mesh = init_device_mesh("npu", (CP,), mesh_dim_names=("cp",))
    model = ScaledAttention(mesh)
    distribute_module(model, mesh)
    ContextParallel(ulysses_degree=degree).apply(model.core, mesh)
    return model, mesh


@pytest.mark.parametrize("degree, moves", [(None, {"AllToAll": 4}), (1, {"AllGather": 2})],
                         ids=["ulysses", "all-gathered-kv"])
def test_context_parallel_attention_equals_one_device(fresh_session, degree, moves):
    """Ulysses: q, k, v sequence -> head (3 AllToAll) and the output back (1); all-gathered:
    k and v gathered (2 AllGather), q stays split. Loss and gradients equal one device."""
    arrays = _inputs()
    expected_loss, expected_grads = _loss_and_grads(ScaledAttention(), [Tensor(a) for a in arrays])
    model, mesh = _parallel(fresh_session, degree)
    loss, grads = _loss_and_grads(model, [distribute_tensor(Tensor(a), mesh, (Shard(1),)) for a in arrays])
    np.testing.assert_allclose(loss, expected_loss, rtol=RTOL)
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    (mesh_report,) = [m for m in session_report("simulation", CP)["meshes"]  # models other tests left alive
                      if m["source"] == "HyperParallel API" and m["dim_names"] == ["cp"]]
    forward = {}  # the forward collectives the style caused (the loss's own full_tensor is the test's)
    for row in mesh_report["collectives"]:
        caused = sum(n for cause, n in row["causes"].items() if cause.startswith("ContextParallel"))
        if row["phase"] == "forward" and caused:
            forward[row["kind"]] = forward.get(row["kind"], 0) + caused
    assert forward == moves


def test_local_sequence_shards_in_and_out(fresh_session):
    """Upstream's form: each rank passes its local sequence shards and gets its output shard."""
    arrays = _inputs()
    expected = CausalCore()(*[Tensor(a) for a in arrays]).asnumpy()
    fresh_session.set_context(device_num=CP)
    mesh = init_device_mesh("npu", (CP,), mesh_dim_names=("cp",))
    core = ContextParallel().apply(CausalCore(), mesh)
    local = [distribute_tensor(Tensor(a), mesh, (Shard(1),)).to_local() for a in arrays]
    out = DTensor.from_local(core(*local), mesh, (Shard(1),)).full_tensor()
    np.testing.assert_allclose(out.asnumpy(), expected, rtol=RTOL, atol=ATOL)


def test_what_it_refuses(fresh_session):
    fresh_session.set_context(device_num=CP)
    mesh = init_device_mesh("npu", (CP,), mesh_dim_names=("cp",))
    with pytest.raises(ValueError, match="hybrid Ulysses x all-gather is not provided"):
        ContextParallel(ulysses_degree=2).apply(CausalCore(), mesh)
    with pytest.raises(ValueError, match="load_balance=True"):
        ContextParallel(ulysses_degree=1, load_balance=True)
    with pytest.raises(ValueError, match="seq_dim and head_dim are both 1"):
        ContextParallel(seq_dim=1, head_dim=1)
    with pytest.raises(ValueError, match="expected three positions"):
        ContextParallel(qkv_indices=(0, 1))
    three_heads = [distribute_tensor(Tensor(np.ones((B, S, 3, D), np.float32)), mesh, (Shard(1),)) for _ in "qkv"]
    core = ContextParallel().apply(CausalCore(), mesh)
    with pytest.raises(ValueError, match="q has 3 heads .* expected a multiple of 4"):
        core(*three_heads)
    with pytest.raises(ValueError, match="expected q, k, v at positions"):
        core(three_heads[0])
    with pytest.raises(ValueError, match="1-D mesh"):
        ContextParallel().apply(CausalCore(), init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "cp")))
