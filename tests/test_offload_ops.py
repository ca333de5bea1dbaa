"""The aot custom ops fetch/store tensors of the same store the Python API uses, in PYNATIVE and
GRAPH mode, with a pass-through gradient for the store op."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

from mindspore_hyper import _core
from mindspore_hyper.offload import OffloadStore
from mindspore_hyper.ops import StoreFetch, StorePut, store_fetch, store_put

BS = 8192


@pytest.fixture
def store(tmp_path):
    s = OffloadStore(block_size=BS, device_memory=2 * BS, host_memory=3 * BS, offload_dir=str(tmp_path),
                     prefetch_depth=2)
    yield s
    s.close()
    ms.set_context(mode=ms.PYNATIVE_MODE)


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
    assert _core.default_tensor_store() is store.tensors  # kernels and Python share it
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
    ms.set_context(mode=ms.PYNATIVE_MODE)
    arrays = [np.full((BS // 4,), i, dtype=np.float32) for i in range(6)]  # one block each
    refs = [store.put(x) for x in arrays]
    assert store.stats()["disk"]["used_blocks"] > 0  # some live on disk only
    for ref, x in zip(refs, arrays):
        np.testing.assert_array_equal(store_fetch(ref).asnumpy(), x)
    out = store_put(Tensor(arrays[0] + 5), refs[0])
    np.testing.assert_array_equal(store.get(refs[0]), arrays[0] + 5)
    np.testing.assert_array_equal(out.asnumpy(), arrays[0] + 5)


def test_fetch_of_unknown_tensor_fails(store):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ref = store.put(np.zeros(4, np.float32))
    store.erase(ref)
    with pytest.raises(Exception):
        StoreFetch(ref)().asnumpy()
