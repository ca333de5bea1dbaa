"""The `sim_synchronize` flag: simulation makes MindSpore launch kernels synchronously, or not."""
import mindspore as ms
from mindspore import nn
from mindspore._c_expression import RuntimeConf

import mindspore_hyper as mh
from mindspore_hyper.runtime.simulation import simulate
from mindspore_hyper.shard import Layout


def test_simulation_sets_launch_blocking(clean_context, monkeypatch):
    calls = []
    original = ms.runtime.launch_blocking
    monkeypatch.setattr(ms.runtime, "launch_blocking", lambda: calls.append(1) or original())
    mh.set_context(device_num=2, sim_synchronize=False)
    simulate(nn.Dense(4, 4), Layout((2,), ("data",))(tensor_map=()))
    assert calls == []  # the flag off: MindSpore's setting left alone
    mh.set_context(sim_synchronize=True)
    simulate(nn.Dense(4, 4), Layout((2,), ("data",))(tensor_map=()))
    assert calls == [1]
    assert RuntimeConf.get_instance().is_launch_blocking()
