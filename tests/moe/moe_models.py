"""Small models around MoE layers, used by the expert-parallel and pipeline tests and the example."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.moe import MoE, MoEBlock
from mindspore_hyper.pipeline import AuxLosses

MICROBATCHES = 2  # of the MoEChain pipeline tests
# gpt-oss's options of MoE (biased router weighting the top-k logits by their softmax, biased clamped-SwiGLU
# experts; a small limit so that the clamps act on these values)
GPT_OSS = dict(router_bias=True, scoring="topk_softmax", expert_bias=True, activation="clamped_swiglu",
               swiglu_alpha=1.702, swiglu_limit=0.5)
# DeepSeek-V3's routing options of MoE (sigmoid scores, score correction bias, top-2-sum groups, scaling factor)
DEEPSEEK = dict(scoring="sigmoid", score_bias=True, group_score="top2_sum", num_groups=4, topk_groups=2,
                routed_scaling_factor=2.5)


class MoENet(nn.Cell):
    """Dense -> MoE (residual) -> Dense, loss = MSE + the router's auxiliary loss."""

    def __init__(self, hidden=16, ffn=24, experts=8, top_k=2, shared=0, capacity_factor=None, routing_bits=False,
                 overlap_chunks=1, dispatch="flat", expert_groups=None, shared_gate=False, **routing):
        super().__init__()
        self.inp = nn.Dense(hidden, hidden)
        self.moe = MoE(hidden, ffn, num_experts=experts, top_k=top_k, capacity_factor=capacity_factor,
                       aux_loss_coef=0.01, z_loss_coef=1e-3, shared_ffn_hidden=shared, routing_bits=routing_bits,
                       overlap_chunks=overlap_chunks, dispatch=dispatch, expert_groups=expert_groups,
                       shared_expert_gate=shared_gate, **routing)
        self.out = nn.Dense(hidden, hidden)

    def construct(self, x, target):
        h = self.inp(x)
        y, aux = self.moe(h)
        pred = self.out(h + y)
        return ((pred - target) ** 2).mean() + aux


class Interleaved(nn.Cell):
    """Two microbatches dispatched before either is combined, combined in reverse order."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x0, x1):
        engine = self.net.moe.parallel()
        a = engine.dispatch(self.net.inp(x0), microbatch=0)
        b = engine.dispatch(self.net.inp(x1), microbatch=1)
        out_b, out_a = engine.compute(b), engine.compute(a)
        y1, _ = engine.combine(out_b)
        y0, _ = engine.combine(out_a)
        return ops.concat((y0, y1), 0)


def randomise_biases(net, seed=7):
    """Non-zero router and expert biases of `net`'s MoE (zeros at construction), large enough to move the choice
    and the outputs."""
    rng = np.random.default_rng(seed)
    moe = net.moe if hasattr(net, "moe") else net
    for p in [moe.router.bias] + moe.experts.biases():
        p.set_data(Tensor((0.5 * rng.normal(size=p.shape)).astype(np.float32)))


def copy_weights(src, dst):
    for p, q in zip(src.get_parameters(), dst.get_parameters()):
        q.set_data(p.data.copy())


def assert_trains_like_one_device(ref, par, sim, data, lr=1e-2):
    """Adam steps of the simulated `sim` (over `par`) on `data` give the losses and parameters of
    the same steps on the single-device `ref` (same initial weights)."""
    ref_opt = nn.Adam(ref.trainable_params(), learning_rate=lr)
    step = ms.value_and_grad(ref, None, ref_opt.parameters)
    ref_losses = []
    for x, t in data:
        loss, grads = step(x, t)
        ref_opt(grads)
        ref_losses.append(float(loss.asnumpy()))
    opt = nn.Adam(sim.optimizer_parameters(), learning_rate=lr)
    losses = [float(sim.train_step(opt, x, t).asnumpy()) for x, t in data]
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for p, q in zip(ref.trainable_params(), par.trainable_params()):
        np.testing.assert_allclose(q.asnumpy(), p.asnumpy(), rtol=1e-4, atol=1e-6, err_msg=p.name)


def assert_computes_like_one_device(ref, par, sim, x, t):
    """The simulated `sim` (over `par`) gives `ref`'s loss and every parameter's gradient on (x, t) (same
    initial weights): float32 sums in another order, 1e-6 on the loss, 1e-4 relative on the gradients."""
    ref_loss, ref_grads = ms.value_and_grad(ref, None, ref.trainable_params())(x, t)
    loss, grads = ms.value_and_grad(sim, None, par.trainable_params())(x, t)
    assert abs(float(ref_loss.asnumpy()) - float(loss.asnumpy())) < 1e-6
    for p, a, b in zip(ref.trainable_params(), ref_grads, grads):
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-4, atol=1e-7, err_msg=p.name)
    return [p.name for p in ref.trainable_params()]


def dry_run_and_balanced_simulation(mh, make_model, strategy):
    """(simulation report, dry-run report) of one train_step of `make_model()` on 4 devices with
    moe_routing="balanced" (the dry run has no logits to rank)."""
    reports = []
    for mode in ("simulation", "dryrun"):
        mh.set_context(mode=mode, device_num=4, moe_routing="balanced")
        ms.set_seed(0)
        model = mh.auto_parallelize(make_model(), strategy)
        optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
        model.train_step(optimizer, *batches(1)[0])
        reports.append(model.report(optimizer))
    return reports


def batches(steps, batch=8, seq=4, hidden=16, seed=0):
    rng = np.random.default_rng(seed)
    return [(Tensor(rng.normal(size=(batch, seq, hidden)).astype(np.float32)),
             Tensor(rng.normal(size=(batch, seq, hidden)).astype(np.float32))) for _ in range(steps)]


def expert_strategy(mesh, tensor=False):
    """Experts split over "expert"; with `tensor`, their F over "tensor" (b_gate and b_up too where the
    experts have biases; b_down whole) and the shared expert Megatron-style (gate/up by output, down by
    input)."""
    strategy = mesh(tensor_map=())
    if tensor:
        strategy.override("*.experts.w_gate", "expert", None, "tensor").override("*.experts.w_up", "expert", None, "tensor")
        strategy.override("*.experts.w_down", "expert", "tensor", None)
        for name, split in (("b_gate", "tensor"), ("b_up", "tensor"), ("b_down", None)):  # gpt-oss's biases
            strategy.override(f"*.experts.{name}", "expert", split, optional=True)
        strategy.override("*.shared.gate.*", "tensor").override("*.shared.up.*", "tensor")
        strategy.override("*.shared.down.weight", None, "tensor")
    else:
        strategy.override("*.experts.*", "expert")
    return strategy


class MoEChain(nn.Cell):
    """Dense -> MoEBlock -> Dense -> MoEBlock -> Dense, MSE loss + the blocks' auxiliary losses."""

    def __init__(self, **moe_options):
        super().__init__()
        opts = dict(top_k=2, aux_loss_coef=0.05, z_loss_coef=1e-3)
        opts.update(moe_options)
        self.inp = nn.Dense(16, 16)
        self.block1 = MoEBlock(16, 24, 4, **opts)
        self.mid = nn.Dense(16, 16)
        self.block2 = MoEBlock(16, 24, 4, **opts)
        self.out = nn.Dense(16, 4)
        self.loss = nn.MSELoss()

    def pipeline_layers(self):
        return [self.inp, self.block1, self.mid, self.block2, self.out]

    def pipeline_loss(self, out, target):
        return self.loss(out, target)

    def construct(self, x, target):
        with AuxLosses() as aux:
            h = x
            for layer in self.pipeline_layers():
                h = layer(h)
        return self.pipeline_loss(h, target) + aux.total()


def chain_data(steps=5):
    rng = np.random.default_rng(4)
    return [(Tensor(rng.normal(size=(8, 16)).astype(np.float32)), Tensor(rng.normal(size=(8, 4)).astype(np.float32)))
            for _ in range(steps)]


def one_device_accumulating(model, data):
    """One device, the batch's microbatches accumulated (mean), one Adam step per batch: the
    router's load-balancing loss is per microbatch, as in the pipeline."""
    opt = nn.Adam(model.trainable_params(), learning_rate=1e-2)

    def loss_fn(x, t):
        xs, ts = np.split(x.asnumpy(), MICROBATCHES), np.split(t.asnumpy(), MICROBATCHES)
        return sum(model(Tensor(a), Tensor(b)) for a, b in zip(xs, ts)) / MICROBATCHES

    step = ms.value_and_grad(loss_fn, None, opt.parameters)
    losses = []
    for x, t in data:
        loss, grads = step(x, t)
        opt(grads)
        losses.append(float(loss.asnumpy()))
    return losses
