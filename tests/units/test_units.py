"""The one byte formatter, element size and numpy dtype helpers (mindspore_hyper/units.py), and
the YAML key `optimizer.offload` refused where no runtime acts on it."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn

from mindspore_hyper import auto_parallelize
from mindspore_hyper.units import format_bytes, itemsize, numpy_dtype


@pytest.mark.parametrize("n, short, text", [(0, False, "0 B"), (1023, True, "1023B"), (1118, False, "1.09 KiB"),
                                            (8192, True, "8.0KiB"), (64 << 30, False, "64.00 GiB"),
                                            (3 << 40, False, "3.00 TiB"), (3 << 40, True, "3072.0GiB")])
def test_format_bytes(n, short, text):
    assert format_bytes(n, short=short) == text


@pytest.mark.parametrize("dtype, size", [(ms.float32, 4), (ms.bfloat16, 2), (ms.int8, 1), ("float16", 2),
                                         (np.float64, 8), (np.dtype("int32"), 4), (6, 6)])
def test_itemsize(dtype, size):
    assert itemsize(dtype) == size


def test_itemsize_refuses_what_has_no_size():
    with pytest.raises(ValueError, match="element size of dtype 'no-such-type'"):
        itemsize("no-such-type")


@pytest.mark.parametrize("dtype", [ms.float32, ms.float16, ms.int64, ms.bool_, ms.bfloat16])
def test_numpy_dtype_is_what_asnumpy_gives(dtype):
    assert numpy_dtype(dtype) == ms.Tensor([1], dtype).asnumpy().dtype


@pytest.mark.parametrize("mode", ["simulation", "distributed"])
def test_optimizer_offload_is_refused_where_not_acted_on(mode):
    config = {"parallel_config": {"device_matrix": [1], "alias_names": ["data"],
                                  "optimizer": {"sharding": False, "offload": True}}}
    with pytest.raises(ValueError, match=r"parallel_config.optimizer.offload=True: not acted on in mode="):
        auto_parallelize(nn.Dense(4, 4), config, mode=mode)
