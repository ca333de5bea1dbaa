"""Global-norm clipping and random numbers under the axis kinds the other tests leave out
(issue 41): clipping under context parallelism (ring, Ulysses), ZeRO-3 through auto_parallelize,
the HyperParallel API's fully_shard (ZeRO-3) and hsdp, and the MoE example's expert parallelism,
each against single-device MindSpore; dropout on attention probabilities under ring and Ulysses;
dropout with gradient accumulation and pipeline micro-batches (what equals what, docs/training.md
"Random numbers").

Norm tolerance (`norm_bound`): the package sums squares in float64 over gradients that differ
from one device's by float32 rounding in another order, and MindSpore's `clip_by_global_norm`
sums the squares of each tensor (ReduceSum over at most `n` elements) and then the tensors'
sums (AddN over `t` terms) in float32. |norm(a) - norm(b)| <= ||a - b|| (triangle inequality),
with ||a - b|| bounded by `gradient_tolerance` (tests/tolerances.py); a float32 sum of n + t
non-negative terms is within gamma_{n+t} relative, squaring adds u, the square root halves the
relative error and adds u: (gamma_{n+t} + u) / 2 + u relative on MindSpore's norm.
"""
import math
import sys

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.runtime.grad_clip import local_square_sum
from paths import EXAMPLES
from test_grad_clip import mindspore_norm, msrun_view
from tolerances import U32, gamma, gradient_tolerance, reduction_length, training_rtol

sys.path.insert(0, str(EXAMPLES))
from models import GPT  # noqa: E402  examples/models.py
from moe_lm import MoELM, moe_strategy  # noqa: E402  examples/moe_lm.py

LR, MOMENTUM = 0.1, 0.9
SEQ, VOCAB = 8, 16


def exact_norm(grads) -> float:
    return float(np.sqrt(sum(np.sum(np.asarray(g.asnumpy(), np.float64) ** 2) for g in grads)))


def norm_bound(grads, reduction: int) -> float:
    """The largest |package norm - MindSpore's single-device norm| allowed (module docstring)."""
    arrays = [np.asarray(g.asnumpy(), np.float64) for g in grads]
    rounding = math.sqrt(sum(float(np.sum(t ** 2)) for t in gradient_tolerance(arrays, reduction)))
    n = max(a.size for a in arrays) + len(arrays)
    return rounding + ((gamma(n) + U32) / 2 + U32) * exact_norm(grads)


def reference_step(ref, inputs, max_norm):
    """One single-device step with ops.clip_by_global_norm: (loss, the gradients before clipping)."""
    loss, grads = ms.value_and_grad(ref, None, ref.trainable_params())(*inputs)
    nn.Momentum(ref.trainable_params(), LR, MOMENTUM)(ops.clip_by_global_norm(grads, max_norm))
    return float(loss), list(grads)


def assert_clips_like_single_device(build, strategy, inputs, tokens, max_norm=0.05):
    """train_step(max_grad_norm=) of `build()` under `strategy`: its norm equals one device's
    (float64 exact norm and MindSpore's float32 one, within norm_bound) and, after the clipped
    step, the parameters equal one device's (training_rtol)."""
    ref = build()
    before = [p.asnumpy().copy() for p in ref.trainable_params()]
    ref_loss, ref_grads = reference_step(ref, inputs, max_norm)
    reduction = reduction_length(ref.trainable_params(), tokens)
    bound = norm_bound(ref_grads, reduction)
    mh.set_context(mode="simulation", device_num=strategy.mesh.size)
    par = mh.auto_parallelize(build(), strategy)
    loss = float(par.train_step(nn.Momentum(par.optimizer_parameters(), LR, MOMENTUM), *inputs,
                                max_grad_norm=max_norm))
    norm = par.last_grad_norm
    assert norm > max_norm  # the clip acts
    assert abs(norm - exact_norm(ref_grads)) <= bound, (norm, exact_norm(ref_grads), bound)
    assert abs(norm - mindspore_norm(ref_grads)) <= bound, (norm, mindspore_norm(ref_grads), bound)
    assert loss == pytest.approx(ref_loss, rel=training_rtol(reduction, 1))
    rtol = training_rtol(reduction, 1)
    for p, start in zip(ref.trainable_params(), before):
        got = par.network.parameters_dict()[p.name].asnumpy()
        err = np.linalg.norm(got - p.asnumpy())
        assert err <= rtol * np.linalg.norm(p.asnumpy() - start) + 4 * U32 * np.linalg.norm(p.asnumpy()), p.name
    return par


def assert_each_rank_counts_once(par):
    """What every msrun process of `par`'s mesh would add (the shards it counts: the first replica's,
    ZeRO-1 slices for parameters with optimizer slices) sums to the global squared norm."""
    rng = np.random.default_rng(5)
    params = list(par.network.trainable_params())
    full = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
    want = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in full)
    total = 0.0
    for rank in range(par.mesh.size):
        shards = []
        for p, g in zip(params, full):
            row = par.rows[id(p)]
            shards.append(g[row.optimizer_layout.rank_slices(rank, row.global_shape)])
        total += local_square_sum(msrun_view(par, rank), shards)
    assert total == pytest.approx(want, rel=1e-12)


# -- clipping under context parallelism ------------------------------------------------------------

def _gpt():
    ms.set_seed(3)
    return GPT(vocab=VOCAB, hidden=8, heads=4, layers=1, seq=SEQ)


def _cp_strategy(method):
    s = Layout((2, 2, 2), ("data", "tensor", "cp"))(tensor_map=(), context_parallel="cp", context_method=method,
                                                     optimizer_state="data")
    s.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
    return s.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")


@pytest.mark.parametrize("method", ["ring", "ulysses"])
def test_clipping_under_context_parallelism_equals_single_device(clean_context, method):
    """data 2 x tensor 2 x cp 2 with ZeRO-1 over data: the norm is one device's (each gradient
    element once: cp replicas not added twice, tensor shards not missed), in simulation and by
    the msrun counting rule of every rank."""
    rng = np.random.default_rng(0)
    ids, labels = (Tensor(rng.integers(0, VOCAB, (2, SEQ)), ms.int32) for _ in range(2))
    par = assert_clips_like_single_device(_gpt, _cp_strategy(method), (ids, labels), tokens=2 * SEQ)
    assert par.report().comm.get("P2P" if method == "ring" else "AllToAll", {}).get("cp")  # the cp attention ran
    assert_each_rank_counts_once(par)


@pytest.mark.parametrize("mesh", [(4, 1), (2, 2)], ids=["data 4", "data 2 x tensor 2"])
def test_clipping_with_zero3_through_auto_parallelize_equals_single_device(clean_context, mesh):
    """ZeRO-3 through auto_parallelize (the estimator's GPT layout as a parallel_config: every
    parameter also split over "data", tests/runtime/dryrun/test_dryrun_equals_simulation.py): the
    norm is one device's and every rank's msrun count adds up to it once."""
    from mindspore_hyper.estimate import JobStrategy
    from mindspore_hyper.estimate.gpt_layout import gpt_parallel_config

    data, tensor = mesh
    strategy = mh.load_parallel_config(gpt_parallel_config(JobStrategy(data=data, tensor=tensor, zero_stage=3)))
    rng = np.random.default_rng(2)
    ids, labels = (Tensor(rng.integers(0, VOCAB, (4, SEQ)), ms.int32) for _ in range(2))
    par = assert_clips_like_single_device(_gpt, strategy, (ids, labels), tokens=4 * SEQ)
    data_axis = par.mesh.alias_names.index("data")  # ZeRO-3: every parameter split over "data"
    assert all(data_axis in par.rows[id(p)].layout.sharded_axes() for p in par.network.trainable_params())
    assert_each_rank_counts_once(par)


# -- clipping with expert parallelism (the MoE example) -------------------------------------------

def _moe():
    ms.set_seed(4)
    return MoELM(vocab=VOCAB, hidden=8, heads=2, layers=1, seq=SEQ, experts=4, top_k=2, expert_ffn=8, shared_ffn=8)


def test_clipping_of_the_moe_example_with_expert_parallelism_equals_single_device(clean_context):
    """examples/moe_lm.py's model and strategy (experts over "expert", tokens over data x expert,
    ZeRO-1 over data) on data 2 x expert 2: train_step's norm is one device's."""
    rng = np.random.default_rng(1)
    ids = Tensor(rng.integers(0, VOCAB, (4, SEQ)), ms.int32)
    par = assert_clips_like_single_device(_moe, moe_strategy(2, 2), (ids, ids), tokens=4 * SEQ)
    assert_each_rank_counts_once(par)


# -- clipping with the HyperParallel API: fully_shard (ZeRO-3) and hsdp ---------------------------

class Mlp(nn.Cell):
    """Dense -> gelu -> Dense -> LayerNorm, mean squared error against `y`."""

    def __init__(self):
        super().__init__()
        self.up, self.down, self.norm = nn.Dense(8, 16), nn.Dense(16, 8), nn.LayerNorm((8,))

    def construct(self, x, y):
        return ((self.norm(self.down(ops.gelu(self.up(x)))) - y) ** 2).mean()


@pytest.fixture
def api_session(pynative):
    from mindspore_hyper.hyper_parallel.session import reset_session

    reset_session()
    yield pynative
    reset_session()


def _api_model(kind, mesh):
    from mindspore_hyper.hyper_parallel import hsdp
    from mindspore_hyper.hyper_parallel.fully_shard import fully_shard

    ms.set_seed(0)
    model = Mlp()
    if kind == "fully_shard":  # ZeRO-3 over 4 devices: parameters, gradients and states split
        fully_shard(model.up, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    return hsdp(model, shard_size=2, threshold=0)  # hybrid: split over "shard", replicated over "replicate"


@pytest.mark.parametrize("kind", ["fully_shard", "hsdp"])
def test_clip_by_global_norm_of_the_hyper_parallel_api_equals_single_device(api_session, kind):
    """A HyperParallel-API loop clipping with MindSpore's own ops.clip_by_global_norm (the
    simulation hands the gradients back as global tensors): the norm, the clipped gradients and
    the parameters after two clipped momentum steps equal one device's."""
    from mindspore_hyper.hyper_parallel import Replicate, Shard, distribute_tensor, init_device_mesh, laid_out_parameters

    api_session.set_context(device_num=4)
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",)) if kind == "fully_shard" else \
        init_device_mesh("npu", (2, 2), mesh_dim_names=("replicate", "shard"))
    batch_split = [Shard(0)] * len(mesh.shape)
    ms.set_seed(0)
    reference = Mlp()
    model = _api_model(kind, mesh)
    want = (Shard(0),) if kind == "fully_shard" else (Replicate(), Shard(0))  # ZeRO-3 / hybrid split
    assert {p.placements for p in laid_out_parameters(model).values()} == {want}
    start = [p.asnumpy().copy() for p in reference.trainable_params()]
    rng = np.random.default_rng(2)
    x, y = (Tensor(rng.standard_normal((4, 8)).astype(np.float32)) for _ in range(2))
    runs = {}
    for name, net, as_input in (("one", reference, lambda t: t),
                                ("api", model, lambda t: distribute_tensor(t, mesh, batch_split))):
        optimizer = nn.Momentum(net.trainable_params(), LR, MOMENTUM)
        grad_fn = ms.value_and_grad(lambda a, b: net(as_input(a), as_input(b)), None, optimizer.parameters)
        steps = []
        for _ in range(2):
            _, grads = grad_fn(x, y)
            clipped = ops.clip_by_global_norm(grads, 0.05)
            steps.append((list(grads), mindspore_norm(grads), [g.asnumpy() for g in clipped]))
            optimizer(clipped)
        runs[name] = steps, [p.asnumpy() for p in net.trainable_params()]
    reduction = reduction_length(reference.trainable_params(), 4)
    (ref_steps, ref_params), (steps, params) = runs["one"], runs["api"]
    for step, ((ref_grads, ref_norm, ref_clipped), (_, norm, clipped)) in enumerate(zip(ref_steps, steps)):
        assert ref_norm > 0.05  # the clip acts
        # step 2 starts from parameters that differ by step 1's rounding: the s-step bound
        bound = norm_bound(ref_grads, reduction) + training_rtol(reduction, step + 1) * ref_norm
        assert abs(norm - ref_norm) <= bound, (step, norm, ref_norm, bound)
        for g, r in zip(clipped, ref_clipped):  # the clipped gradients' norm is 0.05
            np.testing.assert_allclose(g, r, rtol=0, atol=2 * training_rtol(reduction, step + 1) * 0.05)
    rtol = training_rtol(reduction, 2)
    for p, r, s0 in zip(params, ref_params, start):
        assert np.linalg.norm(p - r) <= rtol * np.linalg.norm(r - s0) + 4 * U32 * np.linalg.norm(r)


# -- dropout on attention probabilities under ring and Ulysses ------------------------------------

class DropAttention(nn.Cell):
    """Causal attention with dropout on the attention probabilities (nn.Dropout between the
    softmax and the product with V), a projection and a squared-error loss."""

    def __init__(self, hidden=8, heads=2, p=0.3):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv, self.proj = nn.Dense(hidden, 3 * hidden), nn.Dense(hidden, hidden)
        self.drop = nn.Dropout(p=p)
        self.mask = Tensor(np.triu(np.full((SEQ, SEQ), -1e9, np.float32), 1))

    def construct(self, x, y):
        b, t, h = x.shape
        qkv = self.qkv(x).reshape(b, t, self.heads, 3 * self.head_dim)
        q, k, v = (part.transpose(0, 2, 1, 3) for part in ops.split(qkv, self.head_dim, -1))
        scores = ops.matmul(q, k.swapaxes(-1, -2)) / math.sqrt(self.head_dim) + self.mask
        ctx = ops.matmul(self.drop(ops.softmax(scores, -1)), v)
        return ((self.proj(ctx.transpose(0, 2, 1, 3).reshape(b, t, h)) - y) ** 2).mean()


def _drop_attention():
    ms.set_seed(1)  # weights and the Dropout primitive's seeds
    net = DropAttention()
    net.set_train()
    return net


@pytest.mark.parametrize("method", ["ring", "ulysses"])
def test_attention_dropout_under_context_parallelism_draws_single_device_masks(clean_context, method):
    """Dropout reading the attention probabilities makes them ordinary: they are formed by the
    ordinary sharding rules (each device its rows, K gathered along cp: AllGather, no ring P2P
    or Ulysses AllToAll in the report) and the dropout draws one device's mask (the package's
    global draw, dtensor/random.py), so 3 SGD steps give one device's losses and parameters. The
    masks are checked by their effect: p = 0.3 changes the loss by far more than rounding."""
    rng = np.random.default_rng(0)
    batches = [tuple(Tensor(rng.standard_normal((2, SEQ, 8)).astype(np.float32)) for _ in range(2))
               for _ in range(3)]
    ref = _drop_attention()
    ref_opt = nn.SGD(ref.trainable_params(), LR)
    ref_losses = []
    for x, y in batches:
        loss, grads = ms.value_and_grad(ref, None, ref.trainable_params())(x, y)
        ref_opt(grads)
        ref_losses.append(float(loss))
    mh.set_context(mode="simulation", device_num=4)
    strategy = Layout((2, 2), ("data", "cp"))(tensor_map=(), context_parallel="cp", context_method=method)
    par = mh.auto_parallelize(_drop_attention(), strategy)
    opt = nn.SGD(par.optimizer_parameters(), LR)
    losses = [float(par.train_step(opt, x, y)) for x, y in batches]
    reduction = reduction_length(ref.trainable_params(), 2 * SEQ)
    for step, (got, want) in enumerate(zip(losses, ref_losses)):
        assert got == pytest.approx(want, rel=training_rtol(reduction, step + 1)), step
    for p in ref.trainable_params():
        np.testing.assert_allclose(par.network.parameters_dict()[p.name].asnumpy(), p.asnumpy(),
                                   rtol=training_rtol(reduction, 3), atol=training_rtol(reduction, 3), err_msg=p.name)
    comm = par.report().comm
    assert comm.get("AllGather", {}).get("cp") and "P2P" not in comm and "AllToAll" not in comm
    no_drop = _drop_attention()
    no_drop.set_train(False)
    assert abs(float(no_drop(*batches[0])) - ref_losses[0]) > 100 * training_rtol(reduction, 1) * ref_losses[0]


# -- dropout with micro-batches: k micro-batches equal one device running the same k micro-batches -

# One optimizer step (4 calls of each Dropout): from its 6th call on, an nn.Dropout in a Cell drew
# masks that changed from run to run of the same script under MindSpore 2.10 on the CPU (one
# device, no package; direct calls of the primitive are reproducible): docs/training.md "Random
# numbers".
STEPS_WITH_DROPOUT = 1


def _dropout_chain():
    """Dense / Dropout / ReLU / Dense / Dropout / Tanh / Dense under MSELoss (a Dropout in each of
    a two-stage pipeline's stages), in training mode."""
    ms.set_seed(3)  # weights and each Dropout primitive's seeds
    layers = [nn.Dense(8, 16), nn.Dropout(p=0.5), nn.ReLU(), nn.Dense(16, 12), nn.Dropout(p=0.3), nn.Tanh(),
              nn.Dense(12, 4)]
    model = nn.WithLossCell(nn.SequentialCell(layers), nn.MSELoss())
    model.set_train(True)
    return model


class DrawnMasks:
    """Stands in for an nn.Dropout's primitive in the one-device reference: applies masks drawn
    beforehand by direct calls of that primitive, in call order (`x * mask / keep_prob`, the
    primitive's formula). Drawn by direct calls because MindSpore's draws inside a Cell's forward
    were not reproducible from run to run after a Dropout's 5th call (module comment above
    STEPS_WITH_DROPOUT); each primitive keeps its own generator, so drawing them one Dropout at a
    time gives the sequence that Dropout draws in the model."""

    def __init__(self, primitive, shape, calls):
        self.keep_prob = float(primitive.keep_prob)
        ones = Tensor(np.ones(shape, np.float32))
        self.masks = [primitive(ones)[1] for _ in range(calls)]

    def __call__(self, x):
        mask = self.masks.pop(0)
        return x * mask / self.keep_prob, mask


def _one_device_micro_batches(model, batches, k):
    """One device running the k micro-batches of each batch in order (forward and backward of
    each, each Dropout applying its next mask for the micro-batch's shape), gradients averaged,
    one SGD step per batch: the losses (each the micro-batches' mean)."""
    rows = batches[0][0].shape[0] // k
    for cell in (c for _, c in model.cells_and_names() if isinstance(c, nn.Dropout)):
        width = {0.5: 16, 0.3: 12}[round(1 - float(cell.dropout.keep_prob), 6)]  # the layer widths
        object.__setattr__(cell, "dropout", DrawnMasks(cell.dropout, (rows, width), k * len(batches)))
    optimizer = nn.SGD(model.trainable_params(), LR)
    grad_fn = ms.value_and_grad(model, None, optimizer.parameters)
    result = []
    for x, y in batches:
        losses, total = [], [np.zeros(p.shape, np.float64) for p in optimizer.parameters]
        for xs, ys in zip(np.split(x.asnumpy(), k), np.split(y.asnumpy(), k)):
            loss, grads = grad_fn(Tensor(xs), Tensor(ys))
            losses.append(float(loss.asnumpy()))
            total = [t + g.asnumpy() / k for t, g in zip(total, grads)]
        optimizer(tuple(Tensor(t.astype(np.float32)) for t in total))
        result.append(float(np.mean(losses)))
    return result


@pytest.mark.parametrize("how", ["accumulation", "pipeline"])
def test_micro_batched_dropout_equals_one_device_running_the_same_micro_batches(clean_context, how):
    """train_step(accumulation_steps=4) on data 2, and a 2-stage 1F1B pipeline of 4 micro-batches:
    each Dropout draws one mask per micro-batch, in micro-batch order, so the step equals one
    device running the same 4 micro-batches in order (loss and parameters). Whether that is also
    one device's full-batch step depends on MindSpore's kernel (docs/training.md "Random numbers"),
    so it is not checked; that the masks act is (the loss without dropout is far off)."""
    k, rng = 4, np.random.default_rng(6)
    batches = [(Tensor(rng.standard_normal((16, 8)).astype(np.float32)),
                Tensor(rng.standard_normal((16, 4)).astype(np.float32))) for _ in range(STEPS_WITH_DROPOUT)]
    plain = _dropout_chain()
    plain.set_train(False)  # no dropout
    plain_loss = float(plain(*batches[0]))
    micro = _dropout_chain()
    micro_losses = _one_device_micro_batches(micro, batches, k)
    mh.set_context(mode="simulation", device_num=2)
    net = _dropout_chain()
    if how == "accumulation":
        par = mh.auto_parallelize(net, Layout((2,), ("data",))(tensor_map=()))
        opt = nn.SGD(par.optimizer_parameters(), LR)
        losses = [float(par.train_step(opt, x, y, accumulation_steps=k)) for x, y in batches]
    else:
        par = mh.auto_parallelize(net, Layout((2,), ("pipeline",))(tensor_map=()),
                                  pipeline=dict(schedule="1f1b", microbatches=k, layers_per_stage=(3, 4)))
        opt = nn.SGD(par.optimizer_parameters(), LR)
        losses = [float(par.train_step(opt, x, y).asnumpy()) for x, y in batches]
    reduction = reduction_length(micro.trainable_params(), 16)
    for step in range(STEPS_WITH_DROPOUT):
        rtol = training_rtol(reduction, step + 1)
        assert losses[step] == pytest.approx(micro_losses[step], rel=rtol), step
    assert abs(plain_loss - micro_losses[0]) > 100 * training_rtol(reduction, 1) * micro_losses[0]
    rtol = training_rtol(reduction, STEPS_WITH_DROPOUT)
    trained = dict(net.parameters_and_names())  # trained in place by both models
    for name, p in micro.parameters_and_names():
        got = trained[name].asnumpy()
        np.testing.assert_allclose(got, p.asnumpy(), rtol=rtol, atol=rtol * np.abs(p.asnumpy()).max(), err_msg=name)
