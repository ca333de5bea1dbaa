"""What the bfloat16 emulation (`cpu_bfloat16="emulate"`) covers beyond its kernel table: random ops
(the float32 run's draw, the scale rounded once), broadcasting Add/Mul/Sub/Div (whose MindSpore
backward sums with a ReduceSum that has no bfloat16 CPU kernel) and context-parallel attention
(Ulysses by the dispatcher's rules, ring as one fused float32 kernel).

References: MindSpore's float32 kernels on one device on the same (bfloat16-exact) values, rounded
once by a numpy round-to-nearest-even (bitwise), MindSpore's own bfloat16 kernels where they exist,
the one-device simulation (the whole model through the same emulated dispatcher) for the
exactness of N devices against one, and the float32 ring on the same values for the bfloat16 ring.
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, mint, nn, ops

import mindspore_hyper as mh
from mindspore_hyper.dtensor import distribute_tensor
from mindspore_hyper.migrate.generated_support import scaled_dot_product_attention
from mindspore_hyper.runtime.simulation import simulate
from mindspore_hyper.shard import Layout
from mindspore_hyper.shard.tensor_layout import TensorLayout

from tolerances import assert_within, gamma

U = 2.0 ** -8  # unit roundoff of bfloat16 (8 significant bits)
RNG = np.random.default_rng(5)


def _round(x) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to the even significand), as float32: on the bits."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)


def _f32(t) -> np.ndarray:
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.astype(ms.float32).asnumpy()


X = _round(RNG.standard_normal((8, 4, 16)).astype(np.float32))  # bfloat16-exact: the same values in both dtypes


def _split(x: np.ndarray, dtype):
    """`x` on 4 devices, batch over "data" and sequence over "seq"."""
    mesh = Layout((2, 2), ("data", "seq"))
    return distribute_tensor(Tensor(x).astype(dtype), TensorLayout(mesh, ("data", "seq", None)))


class Drop(nn.Cell):
    """MindSpore's Dropout primitive (seeds given): returns (output, mask)."""

    def __init__(self):
        super().__init__()
        self.drop = ops.Dropout(0.7, 5, 9)

    def construct(self, x):
        return self.drop(x)


def test_dropout_draws_the_float32_mask_and_scales_in_float32_rounded_once(clean_context):
    """A bfloat16 Dropout on 4 devices (batch and sequence split): its mask is the float32 run's
    (the same RNG stream, bit for bit), its output and its input's gradient are the float32
    kernel's rounded once to bfloat16 (x * mask * float32(1 / keep_prob) in float32, as Ascend's
    kernel rounds)."""
    clean_context.set_context(cpu_bfloat16="emulate", device_num=4)
    weight = _round(RNG.standard_normal(X.shape).astype(np.float32))
    ref = Drop()  # the same seeds: the same generator, advancing per call alike
    sim = simulate(Drop(), Layout((2, 2), ("data", "seq"))(tensor_map=(), input_map=("data", "seq")))
    ref_out, ref_mask = ref(Tensor(X))
    ref_grad = ms.grad(lambda a: (ref(a)[0] * Tensor(weight)).sum())(Tensor(X))
    out, mask = sim(Tensor(X).astype(ms.bfloat16))
    grad = ms.grad(lambda a: (sim(a)[0].astype(ms.float32) * Tensor(weight)).sum())(Tensor(X).astype(ms.bfloat16))
    assert out.dtype == ms.bfloat16 and mask.dtype == ms.bfloat16 and grad.dtype == ms.bfloat16
    assert 0 < (ref_mask.asnumpy() == 0).mean() < 1
    np.testing.assert_array_equal(_f32(mask), ref_mask.asnumpy())
    np.testing.assert_array_equal(_f32(out), _round(ref_out.asnumpy()))
    np.testing.assert_array_equal(_f32(grad), _round(ref_grad.asnumpy()))  # weight * mask * scale, rounded once


class DropNet(nn.Cell):
    """Dense, nn.Dropout, Dense, ops.dropout: returns the dropped hidden state and the output. The
    dropouts' inputs are sigmoids (never 0 in bfloat16 here): a zero in the output is a dropped element."""

    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Dense(16, 32), nn.Dropout(p=0.3), nn.Dense(32, 16)

    def construct(self, x):
        h = self.drop(ops.sigmoid(self.fc1(x)))
        return h, ops.dropout(ops.sigmoid(self.fc2(h)), 0.2)


def test_dropout_in_a_bfloat16_cell_masks_like_float32_training(clean_context):
    """The model in a BF16 Cell on data 2 x tensor 2 drops exactly the elements single-device
    float32 training drops, in both dropouts (nn.Dropout's generator and ops.dropout's seeds)."""
    clean_context.set_context(cpu_bfloat16="emulate", device_num=4)
    ms.set_seed(11)
    ref = DropNet()
    ms.set_seed(11)
    net = DropNet().to_float(ms.bfloat16)
    for cell in (ref, net):
        cell.set_train()
    strategy = Layout((2, 2), ("data", "tensor"))(tensor_map=())
    strategy.override("fc1.*", "tensor").override("fc2.weight", None, "tensor")
    sim = simulate(net, strategy)
    for _ in range(2):  # two forwards: the generators advance alike
        ms.set_seed(5)
        ref_h, ref_out = (v.asnumpy() for v in ref(Tensor(X)))
        ms.set_seed(5)
        h, out = sim(Tensor(X))
        assert h.dtype == ms.bfloat16 and out.dtype == ms.bfloat16
        np.testing.assert_array_equal(_f32(h) == 0, ref_h == 0)
        np.testing.assert_array_equal(_f32(out) == 0, ref_out == 0)
        assert 0 < (ref_h == 0).mean() < 1 and 0 < (ref_out == 0).mean() < 1


def test_other_random_ops_are_the_float32_draw(clean_context):
    """ops.bernoulli of a bfloat16 DTensor (no bfloat16 CPU kernel; run once on the gathered input,
    on a float32 copy): the float32 run's draw, bit for bit, as bfloat16."""
    clean_context.set_context(cpu_bfloat16="emulate", device_num=4)
    want = ops.bernoulli(Tensor(X), 0.5, seed=3).asnumpy()
    got = ops.bernoulli(_split(X, ms.bfloat16), 0.5, seed=3)
    assert got.dtype == ms.bfloat16
    assert 0 < want.mean() < 1
    np.testing.assert_array_equal(_f32(got), want)


BROADCASTS = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
              "Div": lambda a, b: a / b}


@pytest.mark.parametrize("name", sorted(BROADCASTS))
def test_a_broadcasting_binary_op_trains_in_bfloat16(clean_context, name):
    """x (8, 4, 16) op b (16,), both bfloat16 on 4 devices: the forward equals MindSpore's own
    bfloat16 kernel bitwise (float32 then bfloat16: 24 >= 2 * 8 + 2 bits, so rounding twice is
    rounding once), and the gradients are the float32 gradients (ReduceSum over the broadcast
    dimensions in float32) rounded once; MindSpore's own backward fails (no bfloat16 ReduceSum)."""
    clean_context.set_context(cpu_bfloat16="emulate", device_num=4)
    op = BROADCASTS[name]
    b = _round(RNG.uniform(0.5, 2.0, 16).astype(np.float32))  # away from 0: Div's divisor
    weight = _round(RNG.standard_normal(X.shape).astype(np.float32))
    mindspore_bf16 = op(Tensor(X).astype(ms.bfloat16), Tensor(b).astype(ms.bfloat16))  # its forward kernel exists
    mesh = Layout((2, 2), ("data", "seq"))

    def loss(x, y):  # x split over batch and sequence, y replicated; the loss in float32
        out = op(distribute_tensor(x, TensorLayout(mesh, ("data", "seq", None))),
                 distribute_tensor(y, TensorLayout.replicated(mesh, 1))).full_tensor()
        return (out.astype(ms.float32) * Tensor(weight)).sum(), out

    (_, got), (gx, gb) = ms.value_and_grad(loss, (0, 1), has_aux=True)(Tensor(X).astype(ms.bfloat16),
                                                                       Tensor(b).astype(ms.bfloat16))
    rx, rb = ms.grad(lambda x, y: (op(x, y) * Tensor(weight)).sum(), (0, 1))(Tensor(X), Tensor(b))
    assert got.dtype == gx.dtype == gb.dtype == ms.bfloat16
    np.testing.assert_array_equal(_f32(got), _f32(mindspore_bf16))
    np.testing.assert_array_equal(_f32(gx), _round(rx.asnumpy()))  # same shapes: no reduction, rounded once
    # b's gradient: each device reduces its 16 of the 32 rows in float32 (gamma_32 of the sum of
    # |terms|), its partial sum is rounded to bfloat16 (u of it), and the partial sums are added and
    # rounded to bfloat16 again (u of the total): within (2 u + gamma_32) of the sum of |terms|
    bound = (2 * U + gamma(32)) * np.abs(_gradient_terms(name, X, b, weight)).sum(axis=(0, 1))
    assert_within(_f32(gb), rb.asnumpy(), bound, f"{name}: the broadcast operand's gradient")
    assert np.any(_f32(gb) != rb.asnumpy()), "the bfloat16 gradient is rounded (not float32's)"
    with pytest.raises(RuntimeError, match="Reduce does not support"):  # what the emulation covers
        ms.grad(lambda x, y: (op(x, y).astype(ms.float32) * Tensor(weight)).sum(), (0, 1))(
            Tensor(X).astype(ms.bfloat16), Tensor(b).astype(ms.bfloat16))[1].asnumpy()


def _gradient_terms(name, x, b, weight):
    """The terms weight * d(op(x, b))/db (float64, x's shape) whose sum over the rows is b's gradient."""
    x, b, w = (np.asarray(v, np.float64) for v in (x, b, weight))
    return {"Add": w, "Sub": -w, "Mul": x * w, "Div": -x / b ** 2 * w}[name] * np.ones_like(x)


class BiasDrop(nn.Cell):
    """A Dense layer, a broadcasting scale and shift (Mul and Add of a (32,) parameter: their
    gradients are ReduceSums over the batch), dropout and a head; mean squared error."""

    def __init__(self):
        super().__init__()
        self.fc, self.drop, self.head = nn.Dense(16, 32), nn.Dropout(p=0.3), nn.Dense(32, 8)
        self.scale = Parameter(Tensor(np.linspace(0.5, 1.5, 32).astype(np.float32)), name="scale")
        self.shift = Parameter(Tensor(np.linspace(-0.5, 0.5, 32).astype(np.float32)), name="shift")

    def construct(self, x, y=None):
        h = self.drop(ops.sigmoid(self.fc(x)) * self.scale + self.shift)
        if y is None:
            return h
        return ((self.head(h) - y) ** 2).mean()


def _train_bias_drop(clean_context, mesh, strategy_of, steps):
    """The model in a BF16 Cell (master weights float32) on `mesh`: its first forward's hidden
    state, then `steps` SGD steps' losses and parameter updates."""
    clean_context.set_context(cpu_bfloat16="emulate", device_num=mesh.size)
    ms.set_seed(11)  # the weights and the dropout's generator
    net = BiasDrop().to_float(ms.bfloat16)
    net.set_train()
    start = [p.asnumpy().copy() for p in net.trainable_params()]
    sim = simulate(net, strategy_of(mesh))
    y = Tensor(np.random.default_rng(1).standard_normal((8, 4, 8)).astype(np.float32))
    h = _f32(sim(Tensor(X)))
    opt = nn.SGD(sim.optimizer_parameters(), 0.1)
    losses = [float(sim.train_step(opt, Tensor(X), y).asnumpy()) for _ in range(steps)]
    return h, np.array(losses), {p.name: p.asnumpy() - p0 for p, p0 in zip(net.trainable_params(), start)}


def test_n_devices_train_like_one_with_dropout_and_a_broadcast_bias(clean_context):
    """Data 2 x tensor 2 (fc column-parallel) against the one-device simulation, both emulated:
    the same dropout masks, hidden states and 3 SGD steps alike."""

    def split(mesh):
        strategy = mesh(tensor_map=())
        if "tensor" in mesh.alias_names:
            strategy.override("fc.*", "tensor")
        return strategy

    steps = 3
    one_h, one_losses, one_updates = _train_bias_drop(clean_context, Layout((1,), ("data",)), split, steps)
    h, losses, updates = _train_bias_drop(clean_context, Layout((2, 2), ("data", "tensor")), split, steps)
    assert 0 < (one_h == 0).mean() < 1
    np.testing.assert_array_equal(h == 0, one_h == 0)  # the same masks (a sigmoid's affine map is not 0 here)
    # h: no reduction is split before it, so the two runs differ only where two float32 kernel
    # evaluations differ in a last bit (gamma_16) and a rounding to bfloat16 then falls the other
    # way: at most one bfloat16 ulp (2 u of the value's scale) at each of its 5 roundings (fc,
    # sigmoid, mul, add, dropout's scale)
    assert_within(h, one_h, 5 * 2 * U * np.abs(one_h).max(), "hidden state")
    # training: each step's gradients pass a reduction three times (forward, two backward products)
    # and the gradient sum over P = 2 data devices of bfloat16-rounded partial sums once:
    # 4 ((P + 1) u + gamma_K) per step, K = 32 the longest float32 fan-in; steps add
    rtol = 4 * steps * ((2 + 1) * U + gamma(32))
    np.testing.assert_allclose(losses, one_losses, rtol=rtol)
    assert set(updates) == {"fc.weight", "fc.bias", "head.weight", "head.bias", "scale", "shift"}
    for name, want in one_updates.items():
        assert np.linalg.norm(want) > 0, name
        assert np.linalg.norm(updates[name] - want) <= rtol * np.linalg.norm(want), name


class Attention(nn.Cell):
    """Causal self-attention by the converted models' scaled_dot_product_attention: 4 heads of 4."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Dense(16, 48)

    def construct(self, x):
        b, t, _ = x.shape
        q, k, v = [y.reshape(b, t, 4, 4).transpose(0, 2, 1, 3) for y in mint.split(self.qkv(x), 16, -1)]
        return scaled_dot_product_attention(q, k, v, is_causal=True)


def _attention_loss_and_grads(clean_context, strategy):
    clean_context.set_context(mode="simulation", cpu_bfloat16="emulate", device_num=strategy.mesh.size)
    ms.set_seed(0)
    model = Attention().to_float(ms.bfloat16)
    parallel = mh.auto_parallelize(model, strategy)
    x = Tensor(np.random.default_rng(2).standard_normal((1, 8, 16)).astype(np.float32))
    loss, grads = ms.value_and_grad(lambda a: (parallel(a).astype(ms.float32) ** 2).sum(), None,
                                    model.trainable_params())(x)
    return float(loss.asnumpy()), [g.asnumpy() for g in grads]


def test_ulysses_attention_in_bfloat16_equals_one_device(clean_context):
    """Context parallelism over 2 devices in a BF16 Cell: Ulysses (its attention runs by the
    dispatcher's rules, emulated) equals the one-device simulation."""
    one_loss, one_grads = _attention_loss_and_grads(clean_context, Layout((1,), ("data",))(tensor_map=()))
    loss, grads = _attention_loss_and_grads(clean_context, Layout((2,), ("cp",))(
        tensor_map=(), context_parallel="cp", context_method="ulysses"))
    # the forward splits no reduction (heads move whole to a device): an output differs only where
    # two float32 kernel evaluations differ in a last bit and a rounding to bfloat16 falls the other
    # way, at most one bfloat16 ulp (2 u) at each of its 6 roundings (qkv's MatMul and BiasAdd,
    # q @ k^T, the scale, softmax, @ v); squared: twice that; a float32 sum of positive terms keeps it
    assert loss == pytest.approx(one_loss, rel=2 * 6 * 2 * U)
    # the weight gradients sum P = 2 devices' bfloat16-rounded partial sums where one device rounds
    # the whole sum once, after reductions passed three times (forward, two backward products):
    # 4 ((P + 1) u + gamma_K) normwise, K = 48 the longest float32 fan-in
    rtol = 4 * ((2 + 1) * U + gamma(48))
    for got, want in zip(grads, one_grads):
        assert np.linalg.norm(got - want) <= rtol * np.linalg.norm(want)


class CausalAttention(nn.Cell):
    """scaled_dot_product_attention of its inputs q, k, v [b, h, t, d], causal."""

    def construct(self, q, k, v):
        return scaled_dot_product_attention(q, k, v, is_causal=True)


def _ring(clean_context, dtype, bfloat16_cell: bool):
    """Ring attention on cp 2 of bfloat16-exact q, k, v given in `dtype`: the output and the
    gradients of (output * weight).sum() (float32 values), and their dtypes."""
    clean_context.set_context(mode="simulation", cpu_bfloat16="emulate", device_num=2)
    rng = np.random.default_rng(4)
    q, k, v, weight = (_round(rng.standard_normal((1, 4, 8, 4)).astype(np.float32)) for _ in range(4))
    model = CausalAttention().to_float(ms.bfloat16) if bfloat16_cell else CausalAttention()
    parallel = mh.auto_parallelize(model, Layout((2,), ("cp",))(tensor_map=(), context_parallel="cp",
                                                                 context_method="ring", input_map=(None, None, "cp")))
    inputs = [Tensor(a).astype(dtype) for a in (q, k, v)]
    out = parallel(*inputs)
    grads = ms.grad(lambda *a: (parallel(*a).astype(ms.float32) * Tensor(weight)).sum(), (0, 1, 2))(*inputs)
    report = parallel.report()
    p2p = (report.comm["P2P"]["cp"]["bytes"], report.comm_backward["P2P"]["cp"]["bytes"])
    assert min(p2p) > 0, "the ring ran, forward and backward"
    return _f32(out), [_f32(g) for g in grads], out.dtype, [g.dtype for g in grads], p2p


@pytest.mark.parametrize("bfloat16_cell", [False, True], ids=["bfloat16 inputs", "BF16 Cell"])
def test_ring_attention_in_bfloat16_is_the_float32_ring_rounded_once(clean_context, bfloat16_cell):
    """Ring attention runs its own kernels on the shards (outside the dispatcher): emulated as one
    fused kernel, bfloat16 in and out and float32 inside (Ascend's FlashAttentionScore). Its output
    and q, k, v's gradients are the float32 ring's on the same values, rounded once, bitwise."""
    want_out, want_grads, _, _, want_bytes = _ring(clean_context, ms.float32, False)
    out, grads, out_dtype, grad_dtypes, moved = _ring(clean_context, ms.float32 if bfloat16_cell else ms.bfloat16,
                                                      bfloat16_cell)
    # on a device the fused kernel's chunks travel in bfloat16: half the float32 ring's bytes
    assert moved == tuple(b // 2 for b in want_bytes), (moved, want_bytes)
    assert out_dtype == ms.bfloat16
    assert grad_dtypes == [ms.float32 if bfloat16_cell else ms.bfloat16] * 3  # the inputs' dtypes
    assert np.any(out != want_out), "rounded to bfloat16"
    np.testing.assert_array_equal(out, _round(want_out))
    for got, want in zip(grads, want_grads):
        np.testing.assert_array_equal(got, _round(want))


class ProjectedRing(nn.Cell):
    """Causal attention of (x w, x, x) in `dtype` (w a float32 master weight cast to it, the causal
    mask a constant in `dtype`) on x [1, 2, 8, 4] sequence-split over cp: a mean loss."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype
        self.w = Parameter(Tensor(RNG.standard_normal((4, 4)).astype(np.float32)), name="w")
        self.mask = Tensor(np.triu(np.full((8, 8), -1e9, np.float32), 1)).astype(dtype)

    def construct(self, x):
        x = x.astype(self.dtype)
        q = ops.matmul(x, self.w.astype(self.dtype))
        scores = ops.matmul(q, x.swapaxes(-1, -2)) * 0.5 + self.mask
        return ops.matmul(ops.softmax(scores, -1), x).astype(ms.float32).mean()


def _ring_step_report(clean_context, mode: str, dtype):
    """The report of one SGD step of `ProjectedRing(dtype)` on ring attention over cp 2 in `mode`."""
    clean_context.set_context(mode=mode, cpu_bfloat16="emulate", device_num=2)
    x = Tensor(np.random.default_rng(6).standard_normal((1, 2, 8, 4)).astype(np.float32))
    model = mh.auto_parallelize(ProjectedRing(dtype), Layout((2,), ("cp",))(
        tensor_map=(), context_parallel="cp", input_map=(None, None, "cp")))
    optimizer = nn.SGD(model.optimizer_parameters(), 0.1)
    model.train_step(optimizer, x)
    return model.report(optimizer)


def test_the_bfloat16_ring_counts_what_a_device_moves_and_keeps_as_a_dry_run_does(clean_context):
    """The emulated ring runs on float32 copies; the report counts the fused kernel's moves and
    held bytes at bfloat16's size (as on a device, and as the dry run counts them): the
    simulation's collectives and memory equal the dry run's, and its K/V bytes are half the
    float32 run's, whose figures are unchanged (counted by hand below). (The step's memory
    timeline still differs: the emulation's rounding of the output is an op of its own.)"""
    dtypes = {"float32": ms.float32, "bfloat16": ms.bfloat16}
    reports = {(mode, name): _ring_step_report(clean_context, mode, dtype)
               for mode in ("simulation", "dryrun") for name, dtype in dtypes.items()}
    for dtype in dtypes:
        sim, dry = reports[("simulation", dtype)], reports[("dryrun", dtype)]
        assert sim.comm == dry.comm and sim.comm_backward == dry.comm_backward, dtype
        assert sim.comm_causes == dry.comm_causes and sim.memory == dry.memory, dtype
    f32, bf16 = reports[("simulation", "float32")], reports[("simulation", "bfloat16")]
    # t = 8 divides by 2 * cp: zigzag. Forward per device: one [1, 2, 2, 4] chunk (16 elements)
    # out in each permute of q, k^T, v and the output, and in the one K/V shift 2 k^T + 2 v chunks
    elements = 4 * 16 + 4 * 16
    assert f32.comm["P2P"]["cp"] == {"count": 5, "bytes": elements * 4, "input_bytes": elements * 4}
    assert bf16.comm["P2P"]["cp"] == {"count": 5, "bytes": elements * 2, "input_bytes": elements * 2}
    backward = f32.comm_backward["P2P"]["cp"]
    assert bf16.comm_backward["P2P"]["cp"] == {"count": backward["count"], "bytes": backward["bytes"] // 2,
                                               "input_bytes": backward["input_bytes"] // 2}
