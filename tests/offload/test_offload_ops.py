"""The aot custom ops fetch/store tensors of the same store the Python API uses, in PYNATIVE and
GRAPH mode, with a pass-through gradient for the store op."""
import os
import shutil
import subprocess

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

from mindspore_hyper import _core
from mindspore_hyper.offload import OffloadStore
from paths import REPO_ROOT
from mindspore_hyper.ops import StoreFetch, StorePut, store_fetch, store_put

BS = 8192
pytestmark = pytest.mark.usefixtures("pynative")


@pytest.fixture
def store(tmp_path):
    s = OffloadStore(block_size=BS, device_memory=2 * BS, host_memory=3 * BS, offload_dir=str(tmp_path),
                     prefetch_depth=2)
    yield s
    s.close()


class PutNet(nn.Cell):
    def __init__(self, ref):
        super().__init__()
        self.put = StorePut(ref)

    def construct(self, x):
        return (self.put(x * 3.0) ** 2).sum()


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_fetch_put_and_grad(store, mode):
    ms.set_context(mode=mode)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    ref = store.put(a)
    assert _core.find_tensor_store(ref.store_handle) is store.tensors  # kernels and Python share it
    np.testing.assert_array_equal(StoreFetch(ref)().asnumpy(), a)

    version = store.blocks.version(ref.blocks[0])
    y = StorePut(ref)(Tensor(a * 2))
    np.testing.assert_array_equal(y.asnumpy(), a * 2)
    np.testing.assert_array_equal(store.get(ref), a * 2)  # written by the kernel
    assert store.blocks.version(ref.blocks[0]) > version

    store.update(ref, a + 1)  # written by Python, seen by the kernel
    np.testing.assert_array_equal(StoreFetch(ref)().asnumpy(), a + 1)

    g = ms.grad(PutNet(ref))(Tensor(a))  # d/dx sum((3x)^2) = 18x, through the identity bprop
    np.testing.assert_allclose(g.asnumpy(), 18 * a, rtol=1e-6)
    np.testing.assert_array_equal(store.get(ref), 3 * a)


def test_ops_on_blocks_spread_over_tiers(store):
    arrays = [np.full((BS // 4,), i, dtype=np.float32) for i in range(6)]  # one block each
    refs = [store.put(x) for x in arrays]
    assert store.stats()["disk"]["used_blocks"] > 0  # some live on disk only
    for ref, x in zip(refs, arrays):
        np.testing.assert_array_equal(store_fetch(ref).asnumpy(), x)
    out = store_put(Tensor(arrays[0] + 5), refs[0])
    np.testing.assert_array_equal(store.get(refs[0]), arrays[0] + 5)
    np.testing.assert_array_equal(out.asnumpy(), arrays[0] + 5)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_two_stores_in_one_process_each_serve_their_kernels(store, tmp_path, mode):
    ms.set_context(mode=mode)
    other = OffloadStore(block_size=BS, device_memory=2 * BS, host_memory=3 * BS,
                         offload_dir=str(tmp_path / "other"), prefetch_depth=2)
    try:
        a, b = np.arange(6, dtype=np.float32), -np.arange(6, dtype=np.float32)
        ref_a, ref_b = store.put(a), other.put(b)
        assert ref_a.tid == ref_b.tid and ref_a.store_handle != ref_b.store_handle  # same id, two stores
        np.testing.assert_array_equal(StoreFetch(ref_a)().asnumpy(), a)
        np.testing.assert_array_equal(StoreFetch(ref_b)().asnumpy(), b)
        StorePut(ref_b)(Tensor(b * 10)).asnumpy()
        np.testing.assert_array_equal(other.get(ref_b), b * 10)
        np.testing.assert_array_equal(store.get(ref_a), a)  # the first store is untouched
    finally:
        other.close()
    assert _core.find_tensor_store(ref_b.store_handle) is None  # closed: its handle is released
    ms.set_context(mode=ms.PYNATIVE_MODE)
    with pytest.raises(Exception):
        StoreFetch(ref_b)().asnumpy()  # the kernel reports the unknown handle


def test_fetch_of_unknown_tensor_fails(store):
    ref = store.put(np.zeros(4, np.float32))
    store.erase(ref)
    with pytest.raises(Exception):
        StoreFetch(ref)().asnumpy()


def test_kernel_fence_passes_after_the_kernels_launched_before_it(store):
    # The offload hooks scrub a Cell's Parameters once a KernelFence launched after the Cell's
    # kernels has passed: that relies on PyNative executing launched kernels in order. Here the
    # only way for the store to hold the chain's result when the fence has passed is that the
    # StorePut kernel (launched before the fence, after a long chain) has run.
    from mindspore import ops
    from mindspore_hyper.offload.fence import KernelFence

    n = 256
    a = Tensor(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32) / n)
    ref = store.put(np.zeros((n, n), np.float32))
    put = StorePut(ref)
    for trial in range(3):
        x = a
        for _ in range(30):
            x = ops.tanh(ops.matmul(x, a) + 1.0)
        put(x)
        fences = [KernelFence() for _ in range(10)]  # more than the pool of fence primitives
        fences[-1].wait()
        got = store.get(ref)  # before anything else synchronizes
        np.testing.assert_array_equal(got, x.asnumpy())
    # The same with MindSpore's own kernels: an assign into a Parameter whose memory a numpy
    # view shares (CPU) has run once a later fence has passed.
    p = ms.Parameter(Tensor(np.zeros((n, n), np.float32)), name="fence_probe")
    view = p.asnumpy()
    for trial in range(3):
        x = a * float(trial + 2)
        for _ in range(30):
            x = ops.tanh(ops.matmul(x, a) + 1.0)
        ops.assign(p, x)
        fence = KernelFence()
        fence.wait()
        got = view.copy()
        np.testing.assert_array_equal(got, x.asnumpy())
        for f in fences:
            f.wait()
            assert f.passed()


def test_fence_primitives():
    fid = _core.fence_new_id()
    assert not _core.fence_poll(fid)
    assert not _core.fence_wait(fid, 0.01)  # times out
    _core.fence_signal(fid)
    assert _core.fence_wait(fid, 0.01)
    assert not _core.fence_poll(fid)  # consumed
    other = _core.fence_new_id()
    _core.fence_forget(other)  # abandoned before it passed: its signal is dropped
    _core.fence_signal(other)
    assert not _core.fence_poll(other)


def test_copy_out_delivers_values_in_the_backward_before_it_ends():
    # TensorCopyOut hands each gradient to a host thread as soon as its kernel has run: the first
    # layers' gradients (computed first in the backward) arrive while later ones are still
    # being computed, and every value equals the gradient MindSpore returns.
    import threading

    from mindspore import ops
    from mindspore_hyper.offload.copy_out import TensorCopyOut

    net = nn.SequentialCell([nn.Dense(64, 64) for _ in range(4)])
    copies, order = {}, []

    def on_grad(k):
        def hook(grad):
            copies[k] = TensorCopyOut(grad)
        return hook

    for k, cell in enumerate(net.cells()):
        cell.weight.register_hook(on_grad(k))
    x = Tensor(np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32))
    grad_fn = ms.value_and_grad(lambda a: ops.reduce_sum(ops.tanh(net(a))), None, net.trainable_params())
    _, grads = grad_fn(x)
    taken = {}

    def take(k):
        taken[k] = copies[k].take()
        order.append(k)

    threads = [threading.Thread(target=take, args=(k,)) for k in copies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(taken) == [0, 1, 2, 3]
    for k in range(4):
        np.testing.assert_array_equal(taken[k], grads[2 * k].asnumpy())
        assert taken[k].dtype == np.float32 and taken[k].shape == (64, 64)


def test_mailbox_primitives():
    mid = _core.mailbox_new_id()
    assert _core.mailbox_take(mid, 0.01) is None  # times out
    _core.mailbox_deliver(mid, np.arange(4, dtype=np.float32))
    got = _core.mailbox_take(mid, 0.01)
    np.testing.assert_array_equal(got.view(np.float32), np.arange(4, dtype=np.float32))
    assert _core.mailbox_take(mid, 0.01) is None  # consumed
    other = _core.mailbox_new_id()
    _core.mailbox_forget(other)  # abandoned before delivery: the delivery is dropped
    _core.mailbox_deliver(other, np.ones(3, np.uint8))
    assert _core.mailbox_take(other, 0.01) is None


def test_copy_out_take_times_out_with_a_clear_error():
    from mindspore_hyper.offload.copy_out import TensorCopyOut

    copy = TensorCopyOut(Tensor(np.ones((2, 3), np.float32)))
    copy.take()  # delivered
    copy.id = _core.mailbox_new_id()  # a mailbox nothing will deliver to
    copy._value = None
    with pytest.raises(TimeoutError, match=r"tensor of shape \(2, 3\) was not delivered within 0 s"):
        copy.take(timeout_s=0.05)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpp_mailbox_stress_program(tmp_path):
    # The fences and mailboxes under concurrent producers, consumers and abandonment (`make tsan`
    # runs the same program under ThreadSanitizer).
    root = str(REPO_ROOT)
    srcs = ["ccsrc/tools/mailbox_stress.cc", "ccsrc/kernels/kernel_fence.cc", "ccsrc/kernels/tensor_mailbox.cc"]
    exe = tmp_path / "mailbox_stress"
    subprocess.run(["g++", "-std=c++17", "-O2", "-pthread", "-Iccsrc", *srcs, "-o", str(exe)],
                   cwd=root, check=True, timeout=300)
    out = subprocess.run([str(exe), "2000"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "wrong=0 missing=0 unexpected=0 left=0" in out.stdout and "MAILBOX STRESS OK" in out.stdout


def test_abandoned_copies_and_fences_leave_nothing_behind():
    from mindspore.graph.api import _pynative_executor
    from mindspore_hyper.offload.copy_out import TensorCopyOut
    from mindspore_hyper.offload.fence import KernelFence

    _pynative_executor.sync()
    before = (_core.fence_pending(), _core.mailbox_pending())
    copy = TensorCopyOut(Tensor(np.ones((4, 4), np.float32)))
    fence = KernelFence()
    copy.abandon()
    fence.abandon()
    with pytest.raises(RuntimeError, match="abandoned"):
        copy.take()
    _pynative_executor.sync()  # both kernels have run: their deliveries were dropped
    assert (_core.fence_pending(), _core.mailbox_pending()) == before
