"""Batched shard execution (dtensor/batched.py): the same values as one kernel per shard (bitwise
except matmuls and sums), and a number of per-shard kernels that does not grow with the device
count."""
import sys

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

import mindspore_hyper as mh
from mindspore_hyper.dtensor import dispatch
from mindspore_hyper.dtensor.execution import standalone_execution
from mindspore_hyper.runtime.simulation import distribute_tensor, simulate
from mindspore_hyper.shard import Layout
from mindspore_hyper.shard.tensor_layout import TensorLayout

from paths import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
from models import GPT  # noqa: E402  examples/models.py

RNG = np.random.default_rng(0)



def gpt_strategy(mesh: Layout):
    """Megatron-style tensor parallel GPT with a vocabulary-parallel embedding and head."""
    s = mesh(tensor_map=(), optimizer_state="data")
    s.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
    s.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
    s.override("embed.*", "tensor").override("head.weight", "tensor")
    return s


def run_gpt(mesh: Layout, batched: bool, model=None):
    """Logits, loss and parameter gradients of the small GPT on `mesh`, batched or per shard."""
    mh.set_context(device_num=mesh.size)
    model = model or GPT(vocab=64, hidden=32, heads=4, layers=1, seq=8)
    sim = simulate(model, gpt_strategy(mesh))
    sim.execution.batch_shards = batched
    ids = Tensor(np.arange(4 * 8).reshape(4, 8) % 64, ms.int32)
    labels = Tensor((np.arange(4 * 8).reshape(4, 8) * 7) % 64, ms.int32)
    logits = sim(ids).asnumpy()
    params = model.trainable_params()
    loss, grads = ms.value_and_grad(lambda i, l: sim(i, l), None, params)(ids, labels)
    return logits, float(loss), [g.asnumpy() for g in grads], model


@pytest.mark.parametrize("shape", [(2, 2), (4, 2)])
def test_gpt_batched_equals_per_shard(shape):
    """Logits, loss and gradients equal up to float rounding (MindSpore's CPU GEMM picks its
    kernel by matrix size, so a batched matmul may round differently; see the per-op test)."""
    mesh = Layout(shape, ("data", "tensor"))
    logits, loss, grads, model = run_gpt(mesh, batched=True)
    ref_logits, ref_loss, ref_grads, _ = run_gpt(mesh, batched=False, model=model)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-6, atol=1e-6 * np.abs(ref_logits).max())
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    for g, r, p in zip(grads, ref_grads, model.trainable_params()):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6 * np.abs(r).max(), err_msg=p.name)


def count_per_shard_runs(monkeypatch, mesh: Layout) -> int:
    runs = []
    original = dispatch._run_local

    def counting(call, decision, *args):
        runs.append(call.name)
        return original(call, decision, *args)

    monkeypatch.setattr(dispatch, "_run_local", counting)
    run_gpt(mesh, batched=True)
    monkeypatch.setattr(dispatch, "_run_local", original)
    return len(runs)


def test_per_shard_kernels_do_not_grow_with_devices(monkeypatch):
    """A forward + backward launches as many per-shard kernels at 64 devices as at 4 (the
    per-shard path alone launches one per distinct shard: many more)."""
    small = count_per_shard_runs(monkeypatch, Layout((2, 2), ("data", "tensor")))
    large = count_per_shard_runs(monkeypatch, Layout((4, 16), ("data", "tensor")))
    assert large == small


def both_ways(fn, *dtensors):
    """fn's global result with batching on and off (the standalone execution of the mesh)."""
    execution = standalone_execution(dtensors[0].layout.mesh)
    outs = []
    for batched in (True, False):
        execution.batch_shards = batched
        try:
            outs.append(fn(*dtensors).asnumpy())
        finally:
            execution.batch_shards = True
    return outs


MESH = Layout((2, 2), ("a", "b"))


def dt(shape, tensor_map, dtype=np.float32):
    return distribute_tensor(Tensor(RNG.standard_normal(shape).astype(dtype)), TensorLayout(MESH, tensor_map))


# Ops whose batched kernel may round differently from the per-shard one (GEMM kernels chosen by
# matrix size; sums reduced in another order): equal to float rounding, the others bitwise.
ROUNDING = ("matmul transpose_b", "matmul 4-D", "bmm", "partial sum all-reduced")


@pytest.mark.parametrize("name,fn,inputs", [
    ("gelu + add broadcast", lambda x, b: ops.gelu(x) + b, [((4, 6, 8), ("a", None, "b")), ((8,), ("b",))]),
    ("matmul transpose_b", lambda x, w: ops.MatMul(transpose_b=True)(x, w), [((8, 6), ("a", None)), ((4, 6), ("b", None))]),
    ("matmul 4-D", lambda q, k: ops.matmul(q, k), [((2, 4, 6, 8), ("a", "b", None, None)), ((2, 4, 8, 6), ("a", "b", None, None))]),
    ("bmm", lambda x, y: ops.bmm(x, y), [((4, 6, 8), ("a", None, None)), ((4, 8, 2), ("a", None, None))]),
    ("softmax", lambda x: ops.softmax(x, -1), [((4, 6, 8), ("a", "b", None))]),
    ("layer norm", lambda x: nn.LayerNorm((8,))(x), [((4, 6, 8), ("a", "b", None))]),
    ("reshape transpose", lambda x: x.reshape(4, 6, 2, 4).transpose(0, 2, 1, 3), [((4, 6, 8), ("a", "b", None))]),
    ("split", lambda x: ops.split(x, 4, -1)[1], [((4, 6, 8), ("a", "b", None))]),
    ("max", lambda x: x.max(axis=-1), [((4, 6, 8), ("a", "b", None))]),
    ("masked fill", lambda x, m: ops.masked_fill(x, m, -1.0), [((4, 8), ("a", "b")), ((4, 8), ("a", None))]),
    ("vocab-parallel embedding", lambda t, i: ops.gather(t, i, 0),
     [((16, 4), ("a", None)), ((4, 6), ("b", None))]),
    ("partial sum all-reduced", lambda x, w: ops.matmul(x, w).sum(-1), [((4, 8), ("a", "b")), ((8, 6), ("b", None))]),
])
def test_op_bitwise_equal_to_per_shard(name, fn, inputs):
    mh.set_context(device_num=MESH.size)
    tensors = []
    for shape, tensor_map in inputs:
        if name == "vocab-parallel embedding" and len(tensors) == 1:
            ids = Tensor(RNG.integers(0, shape[0] * 4, shape).astype(np.int32))
            tensors.append(distribute_tensor(ids, TensorLayout(MESH, tensor_map)))
        elif name == "masked fill" and len(tensors) == 1:
            mask = Tensor(RNG.random(shape) > 0.5)
            tensors.append(distribute_tensor(mask, TensorLayout(MESH, tensor_map)))
        else:
            tensors.append(dt(shape, tensor_map))
    batched, per_shard = both_ways(fn, *tensors)
    if name in ROUNDING:
        np.testing.assert_allclose(batched, per_shard, rtol=1e-6, atol=1e-6 * np.abs(per_shard).max())
    else:
        np.testing.assert_array_equal(batched, per_shard)


def test_384_device_supernode_trains_like_one_device():
    """The design's supernode mesh (data 8 x tensor 8 x pipeline 6): loss and gradients equal the
    single-device model's."""
    mesh = Layout((8, 8, 6), ("data", "tensor", "pipeline"))
    mh.set_context(device_num=mesh.size, topology="supernode384")
    model = GPT(vocab=64, hidden=64, heads=8, layers=1, seq=8)
    ids = Tensor(np.arange(8 * 8).reshape(8, 8) % 64, ms.int32)
    labels = Tensor((np.arange(8 * 8).reshape(8, 8) * 5) % 64, ms.int32)
    params = model.trainable_params()
    ref_loss, ref_grads = ms.value_and_grad(model, None, params)(ids, labels)
    sim = simulate(model, gpt_strategy(mesh))
    loss, grads = ms.value_and_grad(sim, None, params)(ids, labels)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    scale = max(np.abs(g.asnumpy()).max() for g in ref_grads)
    for p, g, r in zip(params, grads, ref_grads):
        np.testing.assert_allclose(g.asnumpy(), r.asnumpy(), rtol=1e-4, atol=1e-5 * scale, err_msg=p.name)
    report = sim.report()
    assert len(report.memory) == 384 and len(report.memory_groups()) < 384
    assert report.comm_time_estimate_s > 0


@pytest.mark.parametrize("layers", [1, 3])
def test_gpt_attention_runs_on_each_devices_heads(layers):
    """examples/models.py's fused qkv is laid out head by head, so under a column split over
    "tensor" each device runs attention on its own heads: no layer gathers its qkv output (a
    [q | k | v] layout gathers in every layer), the vocabulary-parallel loss picks the labels'
    log-probabilities where they are (GatherD, no gather of the logits), and the step equals
    one device's."""
    mh.set_context(device_num=4)
    mesh = Layout((2, 2), ("data", "tensor"))
    model = GPT(vocab=64, hidden=32, heads=4, layers=layers, seq=8)
    ids = Tensor(np.arange(4 * 8).reshape(4, 8) % 64, ms.int32)
    want = float(model(ids, ids).asnumpy())
    sim = simulate(model, gpt_strategy(mesh))
    assert float(sim(ids, ids)) == pytest.approx(want, rel=1e-6)
    assert "AllGather" not in sim.report().comm, sim.report().comm
