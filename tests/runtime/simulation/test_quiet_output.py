"""Quiet, consistent output (issue 42): no MindSpore deprecation warning from the package's own
calls, the report's backward line true to the step, one unit family (KiB/MiB/GiB) in tables and
reports."""
import re
import subprocess
import sys

import numpy as np
from mindspore import Tensor, nn

from mindspore_hyper import Layout
from mindspore_hyper.runtime.simulation import simulate

from paths import REPO_ROOT
from sim_models import MLP

X = Tensor(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32))
Y = Tensor(np.random.default_rng(1).integers(0, 16, (8,)).astype(np.int32))
DECIMAL_UNIT = re.compile(r"\d\s?[KMGT]B\b")  # "8.0KB", "2 MB": the binary units print as KiB/MiB/GiB


def loss_model(optimizer_state=None):
    net = nn.WithLossCell(MLP(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    strategy = Layout((2, 4), ("data", "tensor"))(tensor_map=(), optimizer_state=optimizer_state)
    strategy.override("*fc1.*", "tensor").override("*fc2.weight", None, "tensor")
    return simulate(net, strategy)


def test_no_deprecation_warning_from_a_data_parallel_training_step():
    """The gradient hooks of data-parallel parameters used ops.identity, which MindSpore 2.10 logs
    as deprecated (once per process: so a fresh interpreter)."""
    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "import numpy as np\nfrom mindspore import Tensor, nn\nimport mindspore_hyper as mh\n"
        "from mindspore_hyper import Layout, auto_parallelize\nfrom sim_models import MLP\n"
        "mh.set_context(device_num=2, sim_collectives='mindspore')\n"
        "net = nn.WithLossCell(MLP(), nn.MSELoss())\n"
        "par = auto_parallelize(net, Layout((2,), ('data',))(tensor_map=()))\n"
        "opt = nn.SGD(par.optimizer_parameters(), learning_rate=0.1)\n"
        "x = Tensor(np.ones((4, 16), np.float32))\n"
        "par.train_step(opt, x, Tensor(np.zeros((4, 16), np.float32)))\n"
        "mh.set_context(sim_collectives='library')\n"
        "par.train_step(opt, x, Tensor(np.zeros((4, 16), np.float32)))\n"
        "print('AllReduce' in str(par.report()))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "True"  # the hooked data-parallel gradient sums ran
    assert "deprecated" not in result.stderr.replace("'FusedSparseAdam' is deprecated", ""), result.stderr[-3000:]


def test_backward_line_says_whether_a_backward_ran():
    par = loss_model()
    par(X, Y)  # a forward only
    text = str(par.report())
    assert "backward: none, the last step was a forward without gradients (no backward pass ran)" in text
    optimizer = nn.SGD(par.optimizer_parameters(), learning_rate=0.1)
    par.train_step(optimizer, X, Y)
    report = par.report(optimizer)
    assert report.backward_ran is True and "AllReduce" in report.comm_backward
    assert "backward: recorded when the gradients moved" in str(report) and "no backward" not in str(report)
    par(X, Y)
    assert par.report().backward_ran is False


def test_tables_and_reports_use_binary_units_only():
    par = loss_model("data")
    optimizer = nn.Adam(par.optimizer_parameters(), learning_rate=0.1)
    par.train_step(optimizer, X, Y)
    for text in (str(par.table), str(par.report(optimizer))):
        assert not DECIMAL_UNIT.search(text), DECIMAL_UNIT.findall(text)
        assert "KiB" in text or " B" in text or re.search(r"\dB\b", text)
    assert "KiB" in str(par.table)  # fc1.weight (64, 16) / 4 x 4 bytes = 1.0KiB
