"""The simulation's collectives served by the C++ communication library (sim_collectives="library"):
same results and gradients as the MindSpore-ops backend and the single-device model."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindspore_hyper.shard.reference_executor import reduce_arrays
from mindspore_hyper.comm.library_collectives import LibraryCollectives

from sim_models import MLP, TinyLM
from sim_checks import MESHES, assert_same_as_single_device, tp_strategy

RNG = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def _library(clean_context):
    clean_context.set_context(sim_collectives="library")
    yield


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_all_reduce_forward_and_gradient(op):
    arrays = [RNG.standard_normal((3, 5)).astype(np.float32) for _ in range(4)]
    c = LibraryCollectives()
    out = c.all_reduce([Tensor(a) for a in arrays], op)[0]
    np.testing.assert_allclose(out.asnumpy(), reduce_arrays(arrays, op), rtol=1e-6)

    def f(*xs):
        return (c.all_reduce(list(xs), op)[0] * 3.0).sum()

    grads = ms.grad(f, tuple(range(4)))(*[Tensor(a) for a in arrays])
    stacked = np.stack(arrays)
    for i, g in enumerate(grads):
        if op == "sum":
            expected = np.full((3, 5), 3.0)
        elif op == "avg":
            expected = np.full((3, 5), 3.0 / 4)
        else:
            winner = stacked.argmax(0) if op == "max" else stacked.argmin(0)
            expected = np.where(winner == i, 3.0, 0.0)
        np.testing.assert_allclose(g.asnumpy(), expected, rtol=1e-6)


def test_gather_scatter_alltoall_gradients_match_mindspore_backend():
    from mindspore_hyper.comm.inprocess_collectives import InProcessCollectives as SimCollectives

    arrays = [Tensor(RNG.standard_normal((4, 6)).astype(np.float32)) for _ in range(2)]
    weights = Tensor(RNG.standard_normal((4, 6)).astype(np.float32))

    def run(c):
        def f(a, b):
            g = c.all_gather([a, b], 0)[0]
            rs = c.reduce_scatter([a * 2.0, b], 1, "sum")
            a2a = c.all_to_all([a, b * 3.0], 1, 0)
            return (g[:4] * weights).sum() + sum((x * x).sum() for x in rs) + sum((x * x * x).sum() for x in a2a)

        return f(*arrays), ms.grad(f, (0, 1))(*arrays)

    (v1, g1), (v2, g2) = run(SimCollectives()), run(LibraryCollectives())
    np.testing.assert_allclose(v2.asnumpy(), v1.asnumpy(), rtol=1e-5)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-5, atol=1e-6)


def test_mlp_column_row_parallel_through_the_library():
    s = MESHES["2x4"](tensor_map=())
    s.override("fc1.*", "tensor").override("fc2.weight", None, "tensor")
    assert_same_as_single_device(MLP(), s, Tensor(RNG.standard_normal((8, 16)).astype(np.float32)))


def test_lm_with_vocab_parallel_head_through_the_library():
    ids = Tensor(RNG.integers(0, 64, (8, 8)).astype(np.int32))
    labels = Tensor(RNG.integers(0, 64, (8, 8)).astype(np.int32))
    s = tp_strategy(MESHES["2x2x2"])
    s.override("embed.*", "tensor").override("head.weight", "tensor")
    assert_same_as_single_device(TinyLM(), s, ids, labels)
