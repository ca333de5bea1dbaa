"""The pipeline's ShmTransport over comm.p2p channels, both ends in this process: tensors arrive by
identity in any order, a late tensor names the peer, an unsupported dtype names the tensor."""
from types import SimpleNamespace

import numpy as np
import pytest
from mindspore import Tensor

from mindspore_hyper.pipeline.stage_transport import P2PError, P2PTimeout, attach_header, header_of
from shm_transport_pair import transport_pair
from mindspore_hyper.schedule.actions import P2PTensor, Payload


@pytest.fixture
def transports():
    yield from transport_pair("pp", 0.5)


def test_tensors_arrive_by_identity_in_any_order(transports):
    t0, t1 = transports
    keys = [P2PTensor(Payload.ACTIVATION, 0, 1, mb) for mb in range(3)]
    for mb, key in enumerate(keys):
        t0.send(0, key, Tensor(np.full((2, 3), mb, np.float32)), 1)
    t0.flush()
    t1.expect({0: 3})
    for mb in (2, 0, 1):
        np.testing.assert_array_equal(t1.recv(keys[mb], 0), np.full((2, 3), mb, np.float32))
    grad = P2PTensor(Payload.GRADIENT, 1, 0, 0)
    t1.send(1, grad, Tensor(np.ones(4, np.float32)), 0)
    np.testing.assert_array_equal(t0.recv(grad, 1), np.ones(4, np.float32))


def test_a_header_travels_beside_its_tensor(transports):
    """A stage's DTensor layout travels as a header of ints with its local piece (pipeline_activations.py)."""
    t0, t1 = transports
    marked, plain = P2PTensor(Payload.ACTIVATION, 0, 1, 0), P2PTensor(Payload.ACTIVATION, 0, 1, 1)
    t0.send(0, marked, attach_header(Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)), (1, 2, 2, 2, 6, 1, 1)), 1)
    t0.send(0, plain, Tensor(np.ones(2, np.float32)), 1)
    got = t1.recv(marked, 0)
    assert header_of(got) == (1, 2, 2, 2, 6, 1, 1)
    np.testing.assert_array_equal(got.asnumpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert header_of(t1.recv(plain, 0)) is None


def test_a_late_tensor_and_a_bad_announcement_name_the_peer(transports):
    t0, t1 = transports
    with pytest.raises(P2PTimeout, match=r"rank 1: no 'activation s0->s1 mb9' from rank 0 \(waited at most 0.5 s"):
        t1.recv(P2PTensor(Payload.ACTIVATION, 0, 1, 9), 0)
    with pytest.raises(P2PError, match=r"rank 1: the schedule receives from rank 5, which has no channel"):
        t1.expect({5: 1})


def test_an_unsupported_dtype_names_the_tensor(transports):
    t0, _ = transports
    with pytest.raises(P2PError, match=r"pipeline send of 'activation s0->s1 mb0': arrays\[0\]: dtype complex64"):
        t0.send(0, P2PTensor(Payload.ACTIVATION, 0, 1, 0), SimpleNamespace(asnumpy=lambda: np.zeros(2, np.complex64)),
                1)
