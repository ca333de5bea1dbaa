"""The derived float32 tolerances of tests/tolerances.py accept what another summation order gives
and reject what real bugs give (a missing partial sum, a wrong shard, a lost optimizer step). NumPy
only: Adam as nn.Adam computes it (checked against it in tolerances.adam_first_step_bound)."""
import numpy as np
import pytest

from tolerances import (adam_displacement_bound, adam_first_step_bound, assert_adam_training_close,
                        assert_matmul_close, assert_within, training_rtol)

RNG = np.random.default_rng(0)


def split_k(a, b, parts):
    """a @ b in float32 as the simulation does it with the reduction split over `parts` devices:
    partial products, then their float32 sum (an all-reduce) in reverse order."""
    chunks = np.array_split(np.arange(a.shape[1]), parts)
    partial = [a[:, c] @ b[c] for c in chunks]
    out = np.zeros_like(partial[0])
    for p in reversed(partial):
        out = (out + p).astype(np.float32)
    return out


def test_matmul_bound_accepts_any_split_and_rejects_a_missing_or_doubled_partial_sum():
    a = RNG.standard_normal((16, 512)).astype(np.float32)
    b = RNG.standard_normal((512, 16)).astype(np.float32)
    for parts in (1, 2, 4, 8):
        assert_matmul_close(split_k(a, b, parts), a, b)
    half = a[:, :256] @ b[:256]
    with pytest.raises(AssertionError, match="outside the bound"):
        assert_matmul_close(half, a, b)  # one device's partial sum missing
    with pytest.raises(AssertionError, match="outside the bound"):
        assert_matmul_close(split_k(a, b, 2) + half, a, b)  # one partial sum added twice
    with pytest.raises(AssertionError, match="outside the bound"):
        assert_matmul_close(split_k(a[::-1].copy(), b, 2)[::-1], a, b[:, ::-1].copy())  # a wrong shard order


def adam(param, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    """nn.Adam's update in float32, one gradient per step."""
    p = param.astype(np.float32).copy()
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        lr_t = np.float32(lr * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t))
        p = (p - lr_t * m / (np.sqrt(v) + np.float32(eps))).astype(np.float32)
    return p


def test_adam_first_step_bound_covers_noise_gradients_and_rejects_a_wrong_gradient():
    p = RNG.standard_normal(1000).astype(np.float32) * 0.1
    g = RNG.standard_normal(1000).astype(np.float32) * 1e-2
    g[:10] = RNG.standard_normal(10).astype(np.float32) * 1e-7  # gradients at rounding-noise level
    error = 1e-6  # a gradient tolerance (the relative bound times the gradient scale)
    noisy = g + RNG.uniform(-error, error, g.shape).astype(np.float32)
    bound = adam_first_step_bound(g, error, 1e-2, param=p)
    want = adam(p, [g], 1e-2)
    assert_within(adam(p, [noisy], 1e-2), want, bound)
    assert np.abs(adam(p, [noisy], 1e-2) - want)[:10].max() > 1e-3  # the noise elements did move by ~lr
    wrong = g.copy()
    wrong[100:200] = g[200:300]  # a wrong shard
    with pytest.raises(AssertionError, match="outside the bound"):
        assert_within(adam(p, [wrong], 1e-2), want, bound)


def test_adam_training_check_allows_rounding_and_rejects_a_missing_sum_or_a_lost_step():
    shape, steps, lr = (64, 64), 5, 1e-2
    p = (RNG.standard_normal(shape) * 0.05).astype(np.float32)
    per_device = [[(RNG.standard_normal(shape) * 1e-3).astype(np.float32) for _ in range(2)] for _ in range(steps)]
    grads = [a + b for a, b in per_device]
    want = adam(p, grads, lr)
    # another summation order: every gradient element within gamma_64 (relative) of the reference's
    other = [(g * (1 + RNG.uniform(-4e-6, 4e-6, shape))).astype(np.float32) for g in grads]
    assert_adam_training_close(adam(p, other, lr), want, lr, steps, reduction=64)
    missing = [a for a, _ in per_device]  # one device's gradient never summed in
    with pytest.raises(AssertionError, match="norm"):
        assert_adam_training_close(adam(p, missing, lr), want, lr, steps, reduction=64)
    with pytest.raises(AssertionError, match="norm"):
        assert_adam_training_close(adam(p, grads[:-1], lr), want, lr, steps, reduction=64)  # a lost step


def test_a_noise_only_tensor_moves_by_steps_of_lr_and_is_held_to_adams_displacement_bound():
    """An attention key bias: its exact gradient is 0, its computed one rounding noise (here above
    Adam's eps), whose sign differs between two summation orders."""
    steps, lr = 5, 1e-2
    p = (RNG.standard_normal(48) * 0.05).astype(np.float32)
    noise = [(RNG.standard_normal(48) * 1e-5).astype(np.float32) for _ in range(steps)]
    want, got = adam(p, noise, lr), adam(p, [-n for n in noise], lr)
    assert np.abs(got - want).max() > 2 * lr  # whole steps of ~lr apart
    assert_adam_training_close(got, want, lr, steps, reduction=64, noise_only=True)
    with pytest.raises(AssertionError, match="norm"):
        assert_adam_training_close(got, want, lr, steps, reduction=64)  # the bulk rule does not hold for it
    with pytest.raises(AssertionError, match="outside the bound"):
        assert_adam_training_close(got + 2 * adam_displacement_bound(lr, steps), want, lr, steps, reduction=64,
                                   noise_only=True)


def test_bounds_grow_with_what_they_bound():
    assert training_rtol(512, 5) > training_rtol(64, 5) > training_rtol(64, 1) > 0
    assert adam_displacement_bound(1e-2, 5) == pytest.approx(2 * 1e-2 * 5, rel=0.05)  # ~lr per step and run
