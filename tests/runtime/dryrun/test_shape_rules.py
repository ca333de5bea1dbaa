"""Shape rules against MindSpore's real ops: every op of the DTensor op catalog is run on real
tensors and on MetaTensors of the same shapes and dtypes; a rule must give the real output's
shapes and dtypes exactly, or refuse (no rule) with the op's name; never a different shape.
The models the dry run is measured on must be covered completely."""
import os
import sys

import numpy as np
import pytest
from mindspore import Tensor, nn

from mindspore_hyper.dtensor.meta import DryRunValueError, meta
from mindspore_hyper.dtensor.shape_registry import ShapeRuleError
from mindspore_hyper.tools.coverage.op_catalog import CATALOG
from mindspore_hyper.tools.coverage.op_sweep import make_inputs
from shape_check import checking_shape_rules, signature as _signature
from sim_models import Classifier, TinyLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), "examples"))
from models import GPT  # noqa: E402
from train_transformer import megatron_strategy  # noqa: E402


def catalog_outcomes():
    """op case name -> "ok", "no rule" (refused) or the mismatch."""
    outcomes = {}
    for case in CATALOG:
        inputs = make_inputs(case)
        try:
            real = _signature(case.fn(*inputs))
        except Exception:  # the case itself does not run on one device here
            continue
        try:
            inferred = _signature(case.fn(*[meta(tuple(t.shape), t.dtype) for t in inputs]))
        except (ShapeRuleError, DryRunValueError) as error:
            outcomes[case.name] = f"refused: {str(error)[:80]}"
            continue
        outcomes[case.name] = "ok" if inferred == real else f"MISMATCH real {real} inferred {inferred}"
    return outcomes


def test_catalog_rules_are_exact_or_refuse(pynative):
    outcomes = catalog_outcomes()
    wrong = {k: v for k, v in outcomes.items() if v.startswith("MISMATCH")}
    assert not wrong, wrong
    ok = [k for k, v in outcomes.items() if v == "ok"]
    assert len(ok) >= 40, f"only {len(ok)} catalog ops inferred: {sorted(ok)}"


def test_models_need_no_missing_rule(pynative):
    mh = pynative

    def run(devices, net, strategy, *inputs):
        mh.set_context(device_num=devices, mode="simulation")
        model = mh.auto_parallelize(net, strategy)
        model.execution.batch_shards = False
        model.train_step(nn.Adam(model.optimizer_parameters(), 1e-3), *inputs)

    with checking_shape_rules() as (bad, checked):
        ids = Tensor(np.random.default_rng(0).integers(0, 128, (4, 16)).astype(np.int32))
        run(4, GPT(), megatron_strategy(4), ids, ids)
        ids = Tensor(np.random.default_rng(0).integers(0, 64, (4, 8)).astype(np.int32))
        tp = mh.Layout((2, 2), ("data", "tensor"))(tensor_map=()).override("block.mlp.up.*", "tensor")
        run(4, TinyLM(), tp.override("block.mlp.down.weight", None, "tensor"), ids, ids)
        x = Tensor(np.random.default_rng(1).standard_normal((4, 5, 16)).astype(np.float32))
        labels = Tensor(np.array([0, 1, 2, 0], np.int32))
        run(2, Classifier(), mh.Layout((2,), ("data",))(tensor_map=()), x, Tensor(np.zeros((4, 5), np.bool_)), labels)
    assert not bad, bad
    assert {"MatMul", "LayerNorm", "Softmax", "Gather", "Reshape"} <= checked


def test_cell_backward_hook_rule_is_the_real_ops(pynative):
    """The op MindSpore runs around a Cell with backward hooks (the simulated offload's,
    `watch_cell_backward`): on one tensor (a Dense layer's input and output) and on several of
    two dtypes (a Cell taking a float and an int tensor)."""
    from mindspore import ops

    from mindspore_hyper.offload.hooks import watch_cell_backward

    class Scaled(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(16, 16)

        def construct(self, x, n):
            return self.dense(x) * n.astype(x.dtype)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.scaled, self.head = Scaled(), nn.Dense(16, 1)

        def construct(self, x, n, y):
            return ops.reduce_mean((self.head(self.scaled(x, n)) - y) ** 2)

    mh = pynative
    mh.set_context(device_num=2, mode="simulation")
    net = Net()
    for cell in (net.scaled, net.head):
        watch_cell_backward(cell, lambda: None, lambda: None)
    model = mh.auto_parallelize(net, mh.Layout((2,), ("data",))(tensor_map=()))
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((4, 16)).astype(np.float32))
    with checking_shape_rules() as (bad, checked):
        model.train_step(nn.SGD(model.optimizer_parameters(), 1e-2), x, Tensor(np.full((4, 1), 2, np.int32)),
                         Tensor(np.zeros((4, 1), np.float32)))
    assert not bad, bad
    assert "CellBackwardHook" in checked


def test_missing_rule_names_the_op_and_line(pynative):
    import mindspore as ms
    from mindspore import ops

    with pytest.raises(ShapeRuleError, match=r"^Sort: the dry run has no shape rule.*test_shape_rules\.py"):
        ops.sort(meta((4, 6), ms.float32))


def test_value_reads_are_refused_with_the_line(pynative):
    import mindspore as ms

    t = meta((2, 3), ms.float32)
    for read in (lambda: t.asnumpy(), lambda: float(t.sum()), lambda: bool(t.sum() > 0), lambda: t.item()):
        with pytest.raises(DryRunValueError, match=r"has no value.*test_shape_rules\.py"):
            read()
