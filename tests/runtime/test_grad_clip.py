"""Global-norm gradient clipping over sharded gradients (mindspore_hyper.clip_grad_norm and
train_step(max_grad_norm=...)): every gradient element counted once under data, tensor, sequence,
expert parallelism and ZeRO-1, equal to single-device `mindspore.ops.clip_by_global_norm`."""
import types

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.runtime.grad_clip import counted_once, local_square_sum
from tolerances import U32, gradient_tolerance, reduction_length, training_rtol
from train_helpers import BATCH, batch, exact_norm, parallel, reference_grads, strategy, twins

LR, MOMENTUM, STEPS = 0.1, 0.9, 2


def mindspore_norm(grads) -> float:
    """The global norm as ops.clip_by_global_norm computes it (float32 square sums, AddN, Sqrt)."""
    return float(ops.sqrt(ops.addn([ops.square(g).sum().reshape((1,)) for g in grads])).asnumpy()[0])


def msrun_view(par, rank):
    """`par` as one msrun process holding mesh rank `rank` sees itself (for the counting rule)."""
    return types.SimpleNamespace(network=par.network, rows=par.rows, local_ranks=(rank,), mesh=par.mesh)


EXPERT_SEQ = Layout((2, 2, 2), ("data", "seq", "expert"))


@pytest.mark.parametrize("kind", ["dp", "dxt", "zero", "seq_expert"])
def test_each_process_counts_its_shards_once(kind):
    """What every msrun process would add (its shard's squares if it is the shard's first replica;
    ZeRO-1: its optimizer slice) sums, over the mesh, to the global squared norm: replicas along
    data/sequence axes counted once, tensor/expert/ZeRO shards all counted."""
    _, net = twins()
    if kind == "seq_expert":
        s = EXPERT_SEQ(tensor_map=(), optimizer_state="data")
        s.override("fc1.weight", "expert", None).override("fc2.weight", None, ("seq", "expert"))
        mh.set_context(mode="simulation", device_num=8)
        par = mh.auto_parallelize(net, s)
    else:
        par = parallel(net, kind)
    rng = np.random.default_rng(3)
    params = list(net.trainable_params())
    full = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
    want = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in full)
    total, replicated_total = 0.0, 0.0
    for rank in range(par.mesh.size):
        shards = []
        for p, g in zip(params, full):
            row = par.rows[id(p)]
            layout = row.optimizer_layout if kind in ("zero", "seq_expert") else row.layout
            shards.append(g[layout.rank_slices(rank, row.global_shape)])
        total += local_square_sum(msrun_view(par, rank), shards)
        replicated_total += sum(float(np.sum(s.astype(np.float64) ** 2)) for s in shards)
    assert total == pytest.approx(want, rel=1e-12)
    assert replicated_total > want * 1.05  # summing every process's shards would count replicas again


def test_counted_once_is_the_first_replica():
    mesh = Layout((2, 2, 2), ("data", "tensor", "expert"))
    layout = mesh("tensor", None)  # replicated over data and expert
    counting = [r for r in range(8) if counted_once(layout, r)]
    assert counting == [r for r in range(8) if mesh.coords(r)[0] == 0 and mesh.coords(r)[2] == 0]
    assert len(counting) == 2  # one per tensor shard


@pytest.mark.parametrize("max_norm", [0.05, 2.0])
def test_clip_grad_norm_equals_mindspore_clip_by_global_norm(max_norm):
    """Given the same gradients, the norm is within 1e-6 of MindSpore's (float32) and the clipped
    gradients equal ops.clip_by_global_norm's up to the rounding of the scale."""
    ref, net = twins()
    par = parallel(net, "dxt")
    _, grads = reference_grads(ref, *batch())
    clipped, norm = mh.clip_grad_norm(par, grads, max_norm)
    want = ops.clip_by_global_norm(grads, max_norm)
    assert norm == pytest.approx(exact_norm(grads), rel=1e-12)
    assert norm == pytest.approx(mindspore_norm(grads), rel=1e-6)
    assert par.last_grad_norm == norm
    assert (norm > max_norm) == (max_norm == 0.05)  # both sides of the limit are exercised
    for g, w in zip(clipped, want):
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-6 + 8 * U32, atol=1e-30)


@pytest.mark.parametrize("kind", ["dxt", "zero"])
@pytest.mark.parametrize("max_norm", [0.05, 100.0])
def test_train_step_clips_like_single_device(kind, max_norm):
    """train_step(max_grad_norm=...) over `STEPS` momentum steps equals the single-device loop
    with ops.clip_by_global_norm: the loss and norm of every step, and the trained parameters."""
    ref, net = twins()
    inputs = [batch(seed) for seed in range(STEPS)]
    ref_opt = nn.Momentum(ref.trainable_params(), LR, MOMENTUM)
    before = [p.asnumpy().copy() for p in ref.trainable_params()]
    reduction = reduction_length(ref.trainable_params(), BATCH)
    ref_losses, ref_norms, first_tol = [], [], None
    for x, y in inputs:
        loss, grads = reference_grads(ref, x, y)
        first_tol = first_tol if first_tol is not None else gradient_tolerance([g.asnumpy() for g in grads], reduction)
        ref_losses.append(loss)
        ref_norms.append(exact_norm(grads))
        ref_opt(ops.clip_by_global_norm(grads, max_norm))
    par = parallel(net, kind)
    opt = nn.Momentum(par.optimizer_parameters(), LR, MOMENTUM)
    for step, (x, y) in enumerate(inputs):
        loss = float(par.train_step(opt, x, y, max_grad_norm=max_norm))
        rtol = training_rtol(reduction, step + 1)
        assert loss == pytest.approx(ref_losses[step], rel=rtol)
        if step == 0:  # same parameters: the norm differs by at most the gradients' rounding
            assert abs(par.last_grad_norm - ref_norms[0]) <= float(np.linalg.norm(np.concatenate(
                [t.ravel() for t in first_tol])))
        assert par.last_grad_norm == pytest.approx(ref_norms[step], rel=rtol)
        assert isinstance(par.last_grad_norm, float) and not par.last_step_skipped
    assert (ref_norms[0] > max_norm) == (max_norm == 0.05)
    rtol = training_rtol(reduction, STEPS)
    for p, start in zip(ref.trainable_params(), before):
        got, want = net.parameters_dict()[p.name].asnumpy(), p.asnumpy()
        err = np.linalg.norm(got - want)
        assert err <= rtol * np.linalg.norm(want - start) + 4 * U32 * np.linalg.norm(want), (p.name, err)


def test_clipping_refuses_bad_arguments():
    ref, net = twins()
    par = parallel(net, "dxt")
    opt = nn.SGD(par.optimizer_parameters(), LR)
    x, y = batch()
    for bad in (0, -1.0, float("nan"), float("inf"), "1.0", True):
        with pytest.raises(ValueError, match="max_grad_norm=.*expected a finite number > 0"):
            par.train_step(opt, x, y, max_grad_norm=bad)
    _, grads = reference_grads(ref, x, y)
    with pytest.raises(ValueError, match="max_norm=-2: expected a finite number > 0"):
        mh.clip_grad_norm(par, grads, -2)
    with pytest.raises(ValueError, match=r"grads: got 5 gradients, expected one per trainable parameter of the "
                                         r"model \(6"):
        mh.clip_grad_norm(par, grads[:5], 1.0)
    with pytest.raises(ValueError, match=r"grads: the gradient of 'fc1.weight' has shape \(1, 16\), expected the "
                                         r"parameter's global shape \(32, 16\)"):
        mh.clip_grad_norm(par, [g[:1] for g in grads], 1.0)
    shards = [g[:1] for g in grads]
    with pytest.raises(ValueError, match=r"grads: the gradient of 'fc1.weight' has shape \(1, 16\), expected this "
                                         r"process's shard \(16, 16\)"):
        local_square_sum(msrun_view(par, 0), shards)


def test_pipeline_and_mpmd_refuse_the_training_options():
    """refuse_unsupported names the option and the model kind (a pipeline's own options and
    refusals: tests/pipeline/test_pipeline_training_options.py)."""
    from mindspore_hyper.runtime.training_options import refuse_unsupported

    with pytest.raises(ValueError, match="max_grad_norm=1.0 is not supported by the pipeline model"):
        refuse_unsupported("pipeline", max_grad_norm=1.0)
    with pytest.raises(ValueError, match="accumulation_steps=2 is not supported by the MPMD model"):
        refuse_unsupported("MPMD", accumulation_steps=2)
    with pytest.raises(ValueError, match="loss_scale=1024 is not supported by the pipeline model"):
        refuse_unsupported("pipeline", loss_scale=1024)
    refuse_unsupported("pipeline")  # defaults: nothing to refuse
