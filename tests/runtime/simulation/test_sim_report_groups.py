"""Reports of many devices: one row per group of devices with equal figures."""
import numpy as np
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper.runtime.report import rank_ranges
from mindspore_hyper.runtime.simulation import simulate
from mindspore_hyper.shard import Layout


def test_rank_ranges():
    assert rank_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert rank_ranges([3]) == "3"


def test_many_devices_are_summarised_per_group(clean_context, tmp_path):
    mh.set_context(device_num=32)
    model = nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 16)])
    strategy = Layout((4, 8), ("data", "tensor"))(tensor_map=(), optimizer_state="data")
    strategy.override("0.*", "tensor")
    sim = simulate(model, strategy)
    sim(Tensor(np.ones((8, 16), np.float32))).sum()
    report = sim.report()
    groups = report.memory_groups()
    assert sum(int(label.split("(")[1].rstrip(")")) for label, _ in groups) == 32
    assert len(groups) < 32
    for label, figures in groups:  # every device of a group has the group's figures
        first = int(label.split("-")[0].split(",")[0].split(" ")[0])
        assert report.memory[first] == figures
    text = str(report)
    assert all(label in text for label, _ in groups)
    assert len(text.splitlines()) < 32
    report.plot(str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").stat().st_size > 0


def test_few_equal_devices_are_one_row(clean_context):
    """Issue 42: grouping began above 16 devices, so 4 equal devices printed 4 equal rows."""
    mh.set_context(device_num=4)
    model = nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 16)])
    sim = simulate(model, Layout((4,), ("data",))(tensor_map=()))
    sim(Tensor(np.ones((8, 16), np.float32))).sum()
    report = sim.report()
    assert [label for label, _ in report.memory_groups()] == ["0-3 (4)"]
    rows = [line for line in str(report).splitlines() if line.lstrip().startswith("0-3 (4)")]
    assert len(rows) == 1 and not any(line.lstrip().startswith(("1 ", "2 ", "3 ")) for line in str(report).splitlines())
