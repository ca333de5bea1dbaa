"""The `sim_synchronize` flag: simulation sets MindSpore's synchronous kernel launches, or not."""
import mindspore as ms
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper.runtime.simulation import simulate
from mindspore_hyper.shard import Layout


def test_simulation_sets_pynative_synchronize(clean_context):
    mh.set_context(device_num=2, sim_synchronize=False)
    ms.set_context(pynative_synchronize=False)  # MindSpore's default
    simulate(nn.Dense(4, 4), Layout((2,), ("data",))(tensor_map=()))
    assert ms.get_context("pynative_synchronize") is False  # the flag off: left alone
    mh.set_context(sim_synchronize=True)
    simulate(nn.Dense(4, 4), Layout((2,), ("data",))(tensor_map=()))
    assert ms.get_context("pynative_synchronize") is True
