"""Regression tests of two native guards next to the comm library (issue 11, item 6): mailbox and
kernel-fence waits convert any timeout without overflow (huge and inf mean "no limit", negative
means "no wait"), and adam_step refuses a param/m/v it could only update in a converted copy."""
import threading
import time

import numpy as np
import pytest

from mindspore_hyper import _core

HUGE = [1e12, 1e30, float("inf")]


def _later(seconds, fn):
    t = threading.Timer(seconds, fn)
    t.start()
    return t


@pytest.mark.parametrize("timeout", HUGE)
def test_mailbox_take_with_a_huge_timeout_waits_for_the_delivery(timeout):
    mid = _core.mailbox_new_id()
    t = _later(0.1, lambda: _core.mailbox_deliver(mid, np.arange(5, dtype=np.uint8)))
    got = _core.mailbox_take(mid, timeout)  # before the fix: None at once (the deadline overflowed)
    t.join()
    assert got is not None and got.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("timeout", HUGE)
def test_fence_wait_with_a_huge_timeout_waits_for_the_signal(timeout):
    fid = _core.fence_new_id()
    t = _later(0.1, lambda: _core.fence_signal(fid))
    assert _core.fence_wait(fid, timeout)
    t.join()


@pytest.mark.parametrize("timeout", [0.0, -1.0, -1e30, float("-inf")])
def test_zero_or_negative_timeout_polls(timeout):
    mid = _core.mailbox_new_id()
    start = time.monotonic()
    assert _core.mailbox_take(mid, timeout) is None
    _core.mailbox_deliver(mid, np.ones(2, np.uint8))
    assert _core.mailbox_take(mid, timeout).tolist() == [1, 1]
    fid = _core.fence_new_id()
    assert not _core.fence_wait(fid, timeout)
    _core.fence_signal(fid)
    assert _core.fence_wait(fid, timeout)
    assert time.monotonic() - start < 30  # a poll, not a wait (generous: a loaded machine)


def test_nan_timeout_is_refused():
    with pytest.raises(ValueError, match="timeout_s must be a number of seconds, got nan"):
        _core.mailbox_take(_core.mailbox_new_id(), float("nan"))
    with pytest.raises(ValueError, match="timeout_s must be a number of seconds, got nan"):
        _core.fence_wait(_core.fence_new_id(), float("nan"))


def _adam_args(n=6):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(n).astype(np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32),
            rng.standard_normal(n).astype(np.float32))


@pytest.mark.parametrize("which", [0, 1, 2])
def test_adam_step_refuses_a_float16_or_list_state(which):
    names = ("param", "m", "v")
    args = list(_adam_args())
    args[which] = args[which].astype(np.float16)
    with pytest.raises(TypeError, match=f"adam_step: {names[which]} must be float32 \\(updated in place\\), got float16"):
        _core.adam_step(*args, 0.1, 0.9, 0.999, 1e-8, False)
    args = list(_adam_args())
    args[which] = args[which].tolist()
    with pytest.raises(TypeError, match=f"adam_step: {names[which]} must be a float32 numpy array \\(updated in "
                                        f"place\\), got list"):
        _core.adam_step(*args, 0.1, 0.9, 0.999, 1e-8, False)


def test_adam_step_updates_float32_in_place_like_the_formula():
    param, m, v, grad = _adam_args()
    p0 = param.copy()
    lr_t, b1, b2, eps = (np.float32(x) for x in (0.1, 0.9, 0.999, 1e-8))
    _core.adam_step(param, m, v, grad.astype(np.float16), lr_t, b1, b2, eps, False)  # grad may be converted
    g = grad.astype(np.float16).astype(np.float32)
    one = np.float32(1)
    m_ref = g * (one - b1)  # the kernel's float32 arithmetic, m and v starting at 0
    v_ref = g * g * (one - b2)
    np.testing.assert_allclose(m, m_ref, rtol=1e-6)
    np.testing.assert_allclose(v, v_ref, rtol=1e-6)
    np.testing.assert_allclose(param, p0 - lr_t * m_ref / (eps + np.sqrt(v_ref)), rtol=1e-5)
