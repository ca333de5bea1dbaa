"""Mixed precision in the simulation: MindSpore's amp (float16 compute, float32 master weights, loss
scaling) under data x tensor parallelism equals single-device mixed-precision training; bfloat16 is
refused on CPU naming the kernel; the report counts bytes by dtype.

Tolerance (derived as in tests/tolerances.py): both sides compute every float16 op with the same
casts; they differ only where the simulation splits a reduction. A row-parallel Dense sums P
float16 partial results (each rounded to float16 once, then P - 1 float16 additions) where one
device rounds the whole sum once: at most (P + 1) u16 relative to the sum of |terms|,
u16 = 2**-11; the float32 accumulation inside each kernel adds gamma_K (u32 = 2**-24, negligible).
A step's gradient passes a reduction three times (forward, two backward products) and its
all-reduce once, so one step differs by 4 (P + 1) u16 relative, and the 5 steps' differences add
(first-order, as `training_rtol`): rtol = 4 * steps * ((P + 1) u16 + gamma32_K). Adam's
normalisation turns noise-level gradients into steps of up to lr each, so parameters also get the
elementwise floor `adam_displacement_bound`. For bfloat16 (u = 2**-8) the same derivation gives
32x larger bounds; on CPU it cannot run (see test_bfloat16_refused_naming_the_kernel).
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, amp, nn, ops

from mindspore_hyper.dtensor.dispatch import DTensorOpError
from mindspore_hyper.runtime.simulation import simulate
from mindspore_hyper.shard import Layout

from tolerances import adam_displacement_bound, assert_within, gamma


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """MindSpore's amp O2/O3 writes its rewritten network's source under the working directory
    (rewritten_network/): keep it out of the checkout."""
    monkeypatch.chdir(tmp_path)

U16 = 2.0 ** -11
TP = 2  # tensor-parallel degree: the number of float16 partial sums of a row-parallel Dense
STEPS = 5
LR = 1e-3

RNG = np.random.default_rng(5)
BATCH = [(Tensor(RNG.integers(0, 64, (8, 4)).astype(np.int32)),
          Tensor(RNG.integers(0, 64, (8, 4)).astype(np.int32)))] * STEPS  # one batch: the loss must fall


class Block(nn.Cell):
    """A small language-model block from MindSpore's own layers: embedding, LayerNorm, an MLP with
    GELU, a Dense head and MindSpore's softmax cross-entropy."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.norm = nn.LayerNorm((32,))
        self.up = nn.Dense(32, 64)
        self.act = nn.GELU()
        self.down = nn.Dense(64, 32)
        self.head = nn.Dense(32, 64)
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, ids, labels):
        h = self.embed(ids)
        h = h + self.down(self.act(self.up(self.norm(h))))
        return self.loss(self.head(h).reshape(-1, 64), labels.reshape(-1))


def _amp_block(level, dtype=ms.float16):
    ms.set_seed(1)
    return amp.auto_mixed_precision(Block(), level, dtype=dtype)


def _strategy():
    s = Layout((2, TP), ("data", "tensor"))(tensor_map=(), optimizer_state="data")
    s.override("*up.*", "tensor")  # column parallel
    s.override("*down.weight", None, "tensor")  # row parallel: TP float16 partial sums
    return s


def _train(net, optimizer, scaler):
    """MindSpore's functional amp loop: scaled loss, unscaled gradients, skip on overflow."""
    def forward(ids, labels):
        return scaler.scale(net(ids, labels))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    losses = []
    for ids, labels in BATCH:
        loss, grads = grad_fn(ids, labels)
        grads = scaler.unscale(grads)
        if bool(amp.all_finite(grads).asnumpy()):
            optimizer(grads)
        losses.append(float(scaler.unscale(loss).asnumpy()))
    return losses


def _rtol(reduction):
    return 4 * STEPS * ((TP + 1) * U16 + gamma(reduction))


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_float16_amp_five_steps_equal_single_device(clean_context, level):
    clean_context.set_context(device_num=4)
    ref, par = _amp_block(level), _amp_block(level)
    sim = simulate(par, _strategy())
    ref_opt = nn.Adam(ref.trainable_params(), learning_rate=LR)
    opt = nn.Adam(sim.optimizer_parameters(), learning_rate=LR)
    ref_losses = _train(ref, ref_opt, amp.StaticLossScaler(1024.0))
    losses = _train(sim, opt, amp.StaticLossScaler(1024.0))
    rtol = _rtol(64)
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol)
    assert ref_losses[-1] < ref_losses[0]
    for p, q in zip(ref.trainable_params(), par.trainable_params()):
        assert p.dtype == q.dtype == ms.float32, f"{p.name}: the master weights stay float32"
        a, b = p.asnumpy().astype(np.float64), q.asnumpy().astype(np.float64)
        assert_within(b, a, adam_displacement_bound(LR, STEPS), p.name)
        assert np.linalg.norm(a - b) <= rtol * np.linalg.norm(a), p.name


def test_float16_ops_run_in_float16(clean_context):
    """The amp casts reach the shards: every MatMul's activation operand is float16 (MindSpore's
    kernel launch casts the float32 weight shard to the Cell's float16 itself, as on one device)."""
    clean_context.set_context(device_num=4)
    sim = simulate(_amp_block("O2"), _strategy())
    seen = []
    sim.execution.observer = lambda call, decision: seen.append((call.name, [t.dtype for t in call.tensors]))
    sim(*BATCH[0])
    matmuls = [dtypes for name, dtypes in seen if name in ("MatMul", "MatMulExt", "Dense")]
    assert matmuls and all(dtypes[0] == ms.float16 for dtypes in matmuls), matmuls


def test_bfloat16_refused_naming_the_kernel(clean_context):
    """MindSpore 2.10's CPU kernels have no bfloat16 (MatMul, Gather, Identity, ...): one device and
    the simulation raise MindSpore's kernel-selection error naming the kernel and BFloat16 (the
    simulation's per-shard ops wrap it in DTensorOpError naming the op), never a silent value."""
    clean_context.set_context(device_num=4)
    with pytest.raises(TypeError, match="Unsupported data type"):
        _amp_block("O3", ms.bfloat16)(*BATCH[0])
    sim = simulate(_amp_block("O3", ms.bfloat16), _strategy())
    with pytest.raises((DTensorOpError, TypeError), match="Unsupported data type") as refused:
        sim(*BATCH[0])
    assert ops.add(Tensor([1.0]), Tensor([1.0])).dtype == ms.float32, "the failed forward left no type casting"
    assert "BFloat16" in str(refused.value) and "CPU operator[" in str(refused.value)


def test_report_counts_bytes_by_dtype(clean_context):
    clean_context.set_context(device_num=4)
    sim = simulate(_amp_block("O2"), _strategy())
    opt = nn.Adam(sim.optimizer_parameters(), learning_rate=LR)
    sim.train_step(opt, *BATCH[0])
    report = sim.report(opt)
    by = report.memory_by_dtype[0]
    master = sum(row.param_bytes for row in sim.table if 0 in row.devices)
    assert by["parameters"] == {"float32": master}
    assert by["gradients"] == {"float32": master}
    assert set(by["optimizer_states"]) == {"float32"}
    assert by["optimizer_states"]["float32"] == report.memory[0]["optimizer_states"]
    # O2 runs every cell but LayerNorm in float16: its weights' working copies are float16 (half
    # the bytes of their float32 masters); LayerNorm's gamma and beta are used in float32
    norm = sum(row.param_bytes for row in sim.table if "norm" in row.name)
    assert by["working_weights"] == {"float16": (master - norm) // 2}
    assert report.memory[0]["working_weights"] == (master - norm) // 2
    assert report.memory[0]["total"] == sum(v for k, v in report.memory[0].items() if k != "total")
    assert "float16" in str(report) and "working weights" in str(report)


@pytest.mark.msrun
def test_float16_amp_with_dropout_under_msrun_equals_single_device(tmp_path):
    """4 processes (data 2 x tensor 2): MindSpore's amp O2, loss scaling, nn.Dropout and
    ops.dropout; every process's losses and parameter shards after 5 steps equal single-device
    training (the dropout masks are the single device's: docs/training.md, "Random numbers").
    Then amp O2 in bfloat16 with `cpu_bfloat16="emulate"` equals the hand-written rounding
    reference of tests/runtime/test_mixed_precision_bfloat16.py the same way, and a bfloat16
    Dropout draws the float32 run's mask (its output that one rounded once)."""
    import json
    import os

    from msrun_helpers import run_msrun, worker_logs

    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mp_worker.py")
    proc = run_msrun(worker, [tmp_path], 4, tmp_path / "logs", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(tmp_path / "logs", 4)
    rtol = _rtol(64)
    for rank in range(4):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        np.testing.assert_allclose(result["losses"], result["ref_losses"], rtol=rtol)
        for name, (diff, norm, worst) in result["params"].items():
            assert diff <= rtol * norm and worst <= adam_displacement_bound(LR, STEPS), (rank, name)
        by = result["memory_by_dtype"]
        assert by["parameters"] == {"float32": result["memory"]["parameters"]}  # this process's shards
        assert set(by["working_weights"]) == {"float16"}
        # bfloat16 with the CPU emulation (the same launch): tolerance derived in test_mixed_precision_bfloat16.py
        bf16, rtol16 = result["bfloat16"], 4 * STEPS * ((TP + 1) * 2.0 ** -8 + gamma(64))
        np.testing.assert_allclose(bf16["losses"], bf16["ref_losses"], rtol=rtol16)
        for name, (diff, norm, worst) in bf16["params"].items():
            assert diff <= rtol16 * norm and worst <= adam_displacement_bound(LR, STEPS), (rank, name, "bfloat16")
        assert set(bf16["working_weights"]) == {"bfloat16"}
        # a bfloat16 Dropout across the processes: the float32 run's mask, the output rounded once (bitwise)
        drop = result["bfloat16_dropout"]
        assert drop["dtypes"] == ["BFloat16", "BFloat16"] and 0 < drop["dropped"] < 1, (rank, drop)
        assert drop["mask_equal"] and drop["rounded_once"], (rank, drop)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_native_translation_passes_amp_through(clean_context, level):
    """Native mode: the amp model translates (MindSpore compiles it only on Ascend/GPU): the
    matmuls get their in-strategies, the casts are left to MindSpore and the Cells keep their
    mixed-precision types for MindSpore's graph compiler."""
    import mindspore_hyper as mh

    clean_context.set_context(device_num=4)
    net = _amp_block(level)
    flags = {name: c.mixed_precision_type for name, c in net.cells_and_names() if c.mixed_precision_type is not None}
    step = mh.auto_parallelize(net, _strategy(), mode="native", example_inputs=BATCH[0],
                               optimizer=nn.Adam(net.trainable_params(), learning_rate=LR))
    plan = step.hyper_native_plan
    assert any(key.endswith("up.matmul") for key in plan.primitive_layouts), sorted(plan.primitive_layouts)
    assert plan.left_to_mindspore.get("Cast", 0) >= 1
    assert {name: c.mixed_precision_type for name, c in net.cells_and_names()
            if c.mixed_precision_type is not None} == flags
    assert (level == "O2") == bool(flags)  # O2 marks Cells, O1 rewrote the code with casts
