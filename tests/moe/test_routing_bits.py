"""1-bit routing masks (C++ pack/unpack): lossless round trip, size, layout, errors."""
import numpy as np
import pytest

from mindspore_hyper.moe.routing_bits import pack_routing, packed_routing_bytes, unpack_routing


@pytest.mark.parametrize("tokens,experts", [(1, 1), (3, 5), (16, 8), (37, 128), (0, 4)])
def test_round_trip_is_lossless_and_sized(tokens, experts):
    mask = np.random.default_rng(tokens * 131 + experts).random((tokens, experts)) < 0.3
    packed = pack_routing(mask)
    assert packed.dtype == np.uint8 and packed.size == (tokens * experts + 7) // 8 == packed_routing_bytes(tokens, experts)
    np.testing.assert_array_equal(unpack_routing(packed, tokens, experts), mask)
    # the documented layout: numpy's little-endian packbits of the row-major mask
    np.testing.assert_array_equal(packed, np.packbits(mask.ravel(), bitorder="little"))


def test_integer_masks_and_errors():
    np.testing.assert_array_equal(pack_routing(np.array([[1, 0, 1]], np.int64)), [0b101])
    with pytest.raises(ValueError, match="mask entries must be 0 or 1"):
        pack_routing(np.array([[2, 0]]))
    with pytest.raises(ValueError, match="must be 2-D"):
        pack_routing(np.zeros(4, bool))
    with pytest.raises(ValueError, match="bool or 0/1 integers"):
        pack_routing(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="packed holds 1 bytes; a 3 x 5 mask needs 2"):
        unpack_routing(np.zeros(1, np.uint8), 3, 5)
    with pytest.raises(ValueError, match="padding bits of the last byte are not zero"):
        unpack_routing(np.array([0, 0xFF], np.uint8), 3, 3)


def test_custom_ops_match_the_python_functions():
    import mindspore as ms
    from mindspore import Tensor

    from mindspore_hyper.ops import PackRouting, UnpackRouting

    ms.set_context(mode=ms.PYNATIVE_MODE)
    for tokens, experts in ((13, 7), (16, 8)):
        mask = np.random.default_rng(tokens).random((tokens, experts)) < 0.25
        packed = PackRouting()(Tensor(mask)).asnumpy()
        np.testing.assert_array_equal(packed, pack_routing(mask))
        unpacked = UnpackRouting(tokens, experts)(Tensor(packed)).asnumpy()
        assert unpacked.dtype == np.bool_
        np.testing.assert_array_equal(unpacked, mask)
