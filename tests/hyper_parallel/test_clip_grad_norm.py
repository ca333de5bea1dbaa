"""Global-norm clipping in HyperParallel-API loops (`clip_grad_norm_`, `clip_grads_by_global_norm`,
hyper_parallel/clip_grad.py) in simulation: fully_shard over 4, hsdp 2 x 2 and Colwise/Rowwise
tensor parallelism over 4, each against single-device MindSpore with `ops.clip_by_global_norm`
(the msrun case, where each process holds pieces, is in rank_checks.py).

Norm tolerance (`norm_bound`, as in tests/runtime/test_clip_rng_axes.py): the package sums squares
in float64 over gradients that differ from one device's by float32 rounding in another order
(bounded elementwise by `gradient_tolerance`, so the norms differ by at most the norm of those
bounds: triangle inequality), and MindSpore's norm sums n elements then t tensors in float32
(gamma_{n+t} relative), squares (u) and takes the root (halves it, adds u). A norm that counted a
replicated piece twice or missed a shard is off by a factor >= sqrt(5/4) on these models.
"""
import math

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.hyper_parallel import (
    ColwiseParallel, RowwiseParallel, Shard, clip_grad_norm_, clip_grads_by_global_norm, distribute_tensor,
    enable_mindspore_backward_compat, global_grad_norm, hsdp, init_device_mesh, laid_out_parameters,
    parallelize_module,
)
from mindspore_hyper.hyper_parallel.autograd_compat import disable_mindspore_backward_compat
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard
from tolerances import U32, gamma, gradient_tolerance, reduction_length, training_rtol

LR, MOMENTUM, MAX_NORM = 0.1, 0.9, 0.05


class Mlp(nn.Cell):
    """Dense -> gelu -> Dense, mean squared error against `y`."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Dense(8, 16), nn.Dense(16, 8)

    def construct(self, x, y):
        return ((self.down(ops.gelu(self.up(x))) - y) ** 2).mean()


def mindspore_norm(grads) -> float:
    """The global norm as ops.clip_by_global_norm computes it (float32 square sums, AddN, Sqrt)."""
    return float(ops.sqrt(ops.addn([ops.square(g).sum().reshape((1,)) for g in grads])).asnumpy()[0])


def norm_bound(grads, reduction: int) -> float:
    """The largest |package norm - MindSpore's single-device norm| allowed (module docstring)."""
    arrays = [np.asarray(g.asnumpy(), np.float64) for g in grads]
    exact = math.sqrt(sum(float(np.sum(a ** 2)) for a in arrays))
    rounding = math.sqrt(sum(float(np.sum(t ** 2)) for t in gradient_tolerance(arrays, reduction)))
    n = max(a.size for a in arrays) + len(arrays)
    return rounding + ((gamma(n) + U32) / 2 + U32) * exact


def laid_out(kind):
    """(the model laid out by `kind`, its mesh, the batch's placements, the placements expected)."""
    ms.set_seed(0)
    model = Mlp()
    if kind == "fully_shard":  # ZeRO-3 over 4 devices
        mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
        fully_shard(model.up, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, mesh, [Shard(0)], {"up.weight": "(Shard(0),)", "down.bias": "(Shard(0),)"}
    if kind == "hsdp":  # split over "shard", replicated over "replicate"
        mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("replicate", "shard"))
        model = hsdp(model, shard_size=2, threshold=0)
        return model, mesh, [Shard(0), Shard(0)], {"up.weight": "(Replicate(), Shard(0))"}
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("tp",))  # Megatron: up.bias split, down.bias replicated
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model, mesh, None, {"up.bias": "(Shard(0),)", "down.weight": "(Shard(1),)", "down.bias": "(Replicate(),)"}


@pytest.mark.parametrize("kind", ["fully_shard", "hsdp", "colwise_rowwise"])
def test_clipped_steps_equal_single_device(fresh_session, kind):
    """clip_grads_by_global_norm on value_and_grad's gradients: the norm equals one device's
    ops.clip_by_global_norm norm (norm_bound), and two clipped momentum steps equal one device's."""
    fresh_session.set_context(device_num=4)
    ms.set_seed(0)
    reference = Mlp()
    model, mesh, batch, want = laid_out(kind)
    placements = {k: str(v.placements) for k, v in laid_out_parameters(model).items()}
    assert {k: placements[k] for k in want} == want
    start = [p.asnumpy().copy() for p in reference.trainable_params()]
    rng = np.random.default_rng(2)
    x, y = (Tensor(rng.standard_normal((4, 8)).astype(np.float32)) for _ in range(2))
    as_input = (lambda t: t) if batch is None else (lambda t: distribute_tensor(t, mesh, batch))
    ref_opt, opt = (nn.Momentum(n.trainable_params(), LR, MOMENTUM) for n in (reference, model))
    ref_fn = ms.value_and_grad(reference, None, ref_opt.parameters)
    fn = ms.value_and_grad(lambda a, b: model(as_input(a), as_input(b)), None, opt.parameters)
    reduction = reduction_length(reference.trainable_params(), 4)
    for step in range(2):
        ref_grads = ref_fn(x, y)[1]
        ref_norm = mindspore_norm(ref_grads)
        assert ref_norm > MAX_NORM  # the clip acts
        ref_opt(ops.clip_by_global_norm(ref_grads, MAX_NORM))
        clipped, norm = clip_grads_by_global_norm(opt.parameters, fn(x, y)[1], MAX_NORM)
        # step 2 starts from parameters that differ by step 1's rounding: the s-step bound
        bound = norm_bound(ref_grads, reduction) + training_rtol(reduction, step + 1) * ref_norm
        assert abs(norm - ref_norm) <= bound, (step, norm, ref_norm, bound)
        opt(clipped)
    rtol = training_rtol(reduction, 2)
    for p, r, s0 in zip(model.trainable_params(), reference.trainable_params(), start):
        p, r = p.asnumpy(), r.asnumpy()
        assert np.linalg.norm(p - r) <= rtol * np.linalg.norm(r - s0) + 4 * U32 * np.linalg.norm(r), p.shape


def test_clip_grad_norm_scales_backward_grads_in_place(fresh_session):
    """Upstream's clip_grad_norm_ after torch-style loss.backward() (fully_shard): it returns one
    device's norm and leaves each .grad equal to one device's clipped gradient."""
    fresh_session.set_context(device_num=4)
    ms.set_seed(0)
    reference = Mlp()
    model, _, _, _ = laid_out("fully_shard")
    rng = np.random.default_rng(3)
    x, y = (Tensor(rng.standard_normal((4, 8)).astype(np.float32)) for _ in range(2))
    ref_grads = ms.value_and_grad(reference, None, reference.trainable_params())(x, y)[1]
    enable_mindspore_backward_compat()
    try:
        model(x, y).backward()
        assert global_grad_norm(model) > MAX_NORM
        norm = clip_grad_norm_(model, MAX_NORM)
        grads = [p.grad.asnumpy() for p in model.trainable_params()]
    finally:
        disable_mindspore_backward_compat()
    reduction = reduction_length(reference.trainable_params(), 4)
    assert abs(float(norm) - mindspore_norm(ref_grads)) <= norm_bound(ref_grads, reduction)
    # the clipped gradients have norm MAX_NORM: their rounding is training_rtol of that (one step)
    for g, r in zip(grads, ops.clip_by_global_norm(ref_grads, MAX_NORM)):
        np.testing.assert_allclose(g, r.asnumpy(), rtol=0, atol=2 * training_rtol(reduction, 1) * MAX_NORM)


def test_bad_input_is_refused_naming_the_field(fresh_session):
    fresh_session.set_context(device_num=4)
    model, _, _, _ = laid_out("fully_shard")
    grads = [ops.zeros_like(p) for p in model.trainable_params()]
    with pytest.raises(ValueError, match=r"max_norm=0: expected a finite number > 0"):
        clip_grads_by_global_norm(model, grads, 0)
    with pytest.raises(ValueError, match=r"grads: got 3 gradients, expected one per Parameter \(4"):
        clip_grads_by_global_norm(model, grads[:3], 1.0)
    with pytest.raises(ValueError, match=r"expected the Parameter's global shape \(16, 8\)"):
        clip_grads_by_global_norm(model, [Tensor(np.zeros((4, 8), np.float32))] + grads[1:], 1.0)
    with pytest.raises(TypeError, match=r"parameters\[0\]: expected a mindspore Parameter"):
        global_grad_norm([Tensor(np.zeros(2, np.float32))], [Tensor(np.zeros(2, np.float32))])
    with pytest.raises(ValueError, match=r"norm_type=1.0: only 2.0"):
        clip_grad_norm_(model, 1.0, norm_type=1.0)
    with pytest.raises(ValueError, match=r"parameters: no Parameter holds a gradient"):
        clip_grad_norm_(model, 1.0)
