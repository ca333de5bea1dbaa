"""bfloat16 training on CPU with the emulation (`cpu_bfloat16="emulate"`): MindSpore's amp O2 in
bfloat16, data 2 x tensor 2 with ZeRO-1 in the simulation, equals a hand-written single-device
float32 model that rounds to bfloat16 where the bfloat16 model's kernels do (forward, gradients,
5 Adam steps); the report counts the bfloat16 working weights.

The reference (`Reference`) is plain MindSpore float32 on one device: `r(x) = cast(cast(x,
bfloat16), float32)` after every op that runs in bfloat16 under O2 (the emulated ones: Gather,
MatMul, BiasAdd, GeLU, the loss; and Add, whose bfloat16 CPU kernel rounds the float32 sum once)
and on every weight the bfloat16 Cells cast (O2 keeps LayerNorm in float32 but nn.LayerNorm casts
gamma and beta to its bfloat16 input's dtype, and O2 casts its output back to bfloat16). Its
backward rounds the gradients where the casts' backward does, as the emulated model's does.

Tolerance (docs/training.md's float16 derivation with bfloat16's unit roundoff u = 2**-8): both
sides round at the same points; they differ where the simulation splits a contraction. The
row-parallel `down` sums P = 2 bfloat16 partial results (each rounded once, then P - 1 bfloat16
additions) where one device rounds the whole sum once: at most (P + 1) u relative to the sum of
|terms|; the float32 kernels' accumulation adds gamma_K (K = 64, the longest fan-in; u32 = 2**-24,
negligible). The forward passes that contraction once and rounds the loss once more: the loss
within (P + 2) u + gamma_K. A step's gradient passes a reduction three times (forward, two
backward products) and its all-reduce once: 4 (P + 1) u per step, and the 5 steps' differences
add: rtol = 4 * steps * ((P + 1) u + gamma_K) (23% after 5 steps: bfloat16 keeps 8 bits).
Adam's normalisation turns noise-level gradients into steps of up to lr, so parameters also get
the elementwise floor `adam_displacement_bound`. Because that bound is loose, the tests also check
what it cannot: every activation and the loss are bfloat16 values, and the emulated model differs
from the float32 model (the casts act).
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, amp, nn, ops

from mindspore_hyper.dtensor.dispatch import DTensorOpError
from mindspore_hyper.runtime.simulation import simulate

from tolerances import adam_displacement_bound, assert_within, gamma

from test_mixed_precision import BATCH, LR, STEPS, TP, Block, _strategy

U = 2.0 ** -8  # unit roundoff of bfloat16 (8 significant bits)
K = 64  # longest fan-in of a float32 kernel accumulation (down: 64 inputs; head's softmax: 64 classes)


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """amp O2 writes its rewritten network's source under the working directory: keep it out of the checkout."""
    monkeypatch.chdir(tmp_path)


def r(x):
    """Round float32 `x` to bfloat16 and back (MindSpore's Cast: to nearest, ties to even)."""
    return ops.cast(ops.cast(x, ms.bfloat16), ms.float32)


class Reference(Block):
    """`Block` in float32 with the roundings of its amp O2 bfloat16 run (module docstring)."""

    def construct(self, ids, labels):
        h = r(ops.gather(r(self.embed.embedding_table), ids.reshape(-1), 0)).reshape(ids.shape + (32,))
        n = r(self.norm.layer_norm(h, r(self.norm.gamma), r(self.norm.beta))[0])

        def dense(cell, x):
            x = x.reshape(-1, x.shape[-1])
            return r(cell.bias_add(r(cell.matmul(x, r(cell.weight))), r(cell.bias)))

        u = dense(self.up, n)
        g = r(ops.gelu(u, approximate="tanh"))  # nn.GELU() is the tanh form (the GeLU primitive)
        h = r(h + dense(self.down, g).reshape(h.shape))
        logits = dense(self.head, h)
        return r(self.loss.sparse_softmax_cross_entropy(logits, labels.reshape(-1)))


def _emulated(clean_context):
    clean_context.set_context(device_num=4, cpu_bfloat16="emulate")
    ms.set_seed(1)
    net = amp.auto_mixed_precision(Block(), "O2", dtype=ms.bfloat16)
    return net, simulate(net, _strategy())


def _reference():
    ms.set_seed(1)
    return Reference()


def _float32():
    ms.set_seed(1)
    return Block()


def _is_bfloat16_value(x: np.ndarray) -> bool:
    """Whether float32 values are exactly bfloat16 numbers (the low 16 bits of each are zero)."""
    return not (np.asarray(x, np.float32).view(np.uint32) & 0xFFFF).any()


def test_forward_and_gradients_equal_the_reference(clean_context):
    net, sim = _emulated(clean_context)
    ref, fp32 = _reference(), _float32()
    grad = ms.value_and_grad(lambda *b: sim(*b), None, sim.trainable_params())
    loss, grads = grad(*BATCH[0])
    ref_loss, ref_grads = ms.value_and_grad(ref, None, ref.trainable_params())(*BATCH[0])
    fp32_loss = fp32(*BATCH[0])
    got, want = float(loss.asnumpy()), float(ref_loss.asnumpy())
    assert _is_bfloat16_value(got) and _is_bfloat16_value(want)
    assert abs(got - want) <= ((TP + 2) * U + gamma(K)) * abs(want), (got, want)
    assert not _is_bfloat16_value(float(fp32_loss.asnumpy())), "the float32 model's loss: the test's premise"
    rtol = 4 * ((TP + 1) * U + gamma(K))
    names = [p.name for p in ref.trainable_params()]
    for name, g, h in zip(names, grads, ref_grads):
        assert g.dtype == ms.float32, f"{name}: gradients of the float32 master weights are float32"
        a, b = h.asnumpy().astype(np.float64), g.asnumpy().astype(np.float64)
        assert np.linalg.norm(a - b) <= rtol * np.linalg.norm(a), (name, np.linalg.norm(a - b) / np.linalg.norm(a))


def test_five_adam_steps_equal_the_reference(clean_context):
    net, sim = _emulated(clean_context)
    ref = _reference()
    ref_opt = nn.Adam(ref.trainable_params(), learning_rate=LR)
    opt = nn.Adam(sim.optimizer_parameters(), learning_rate=LR)
    ref_grad = ms.value_and_grad(ref, None, ref_opt.parameters)
    losses, ref_losses = [], []
    for ids, labels in BATCH:
        losses.append(float(sim.train_step(opt, ids, labels).asnumpy()))
        loss, grads = ref_grad(ids, labels)
        ref_opt(grads)
        ref_losses.append(float(loss.asnumpy()))
    rtol = 4 * STEPS * ((TP + 1) * U + gamma(K))
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol)
    assert ref_losses[-1] < ref_losses[0] and losses[-1] < losses[0]
    for p, q in zip(ref.trainable_params(), net.trainable_params()):
        assert p.dtype == q.dtype == ms.float32, f"{p.name}: the master weights stay float32"
        a, b = p.asnumpy().astype(np.float64), q.asnumpy().astype(np.float64)
        assert_within(b, a, adam_displacement_bound(LR, STEPS), p.name)
        assert np.linalg.norm(a - b) <= rtol * np.linalg.norm(a), p.name


def test_report_counts_bfloat16_working_weights(clean_context):
    net, sim = _emulated(clean_context)
    opt = nn.Adam(sim.optimizer_parameters(), learning_rate=LR)
    sim.train_step(opt, *BATCH[0])
    report = sim.report(opt)
    by = report.memory_by_dtype[0]
    master = sum(row.param_bytes for row in sim.table if 0 in row.devices)
    assert by["parameters"] == {"float32": master} and by["gradients"] == {"float32": master}
    norm = sum(row.param_bytes for row in sim.table if "norm" in row.name)  # LayerNorm's stay float32 under O2
    assert by["working_weights"] == {"bfloat16": (master - norm) // 2}
    assert "bfloat16" in str(report)


def test_without_the_flag_bfloat16_is_refused_naming_it(clean_context):
    """The default (`cpu_bfloat16="mindspore"`) runs MindSpore's kernels: the first op without a
    bfloat16 CPU kernel fails, and the message names the flag that emulates it."""
    clean_context.set_context(device_num=4)
    ms.set_seed(1)
    sim = simulate(amp.auto_mixed_precision(Block(), "O2", dtype=ms.bfloat16), _strategy())
    with pytest.raises((DTensorOpError, TypeError), match="Unsupported data type") as refused:
        sim(*BATCH[0])
    assert "cpu_bfloat16='emulate'" in str(refused.value) and "BFloat16" in str(refused.value)
    assert ops.add(Tensor([1.0]), Tensor([1.0])).dtype == ms.float32, "later ops run in their own dtype again"
