"""Each communication row of the per-device report names what caused it: the op and input a
redistribution is for (with the Cell of the op's parameter), a parameter's gradient sync, the
optimizer's ZeRO-1 gather, the model output made whole; the same causes in the dry run and in
the HyperParallel/dry-run unified report."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper.dtensor.redistribution import DIRECT_CAUSE
from mindspore_hyper.runtime.simulation import simulate
from mindspore_hyper.shard import Layout
from mindspore_hyper.hyper_parallel.report import format_report, session_report
from mindspore_hyper.runtime.report import causes_text

from sim_models import MLP

X = Tensor(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32))
MLP_PARAMETERS = ("fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight")


class SummedMLP(MLP):
    """The MLP returning the sum of its outputs: a scalar loss for train_step."""

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x))).sum()


def _column_column(optimizer_state=None):
    """fc1 and fc2 both split along their output features over 'tensor' (data 2 x tensor 2): fc2's
    MatMul reads fc1's column-split output, so one of its inputs must be redistributed."""
    strategy = Layout((2, 2), ("data", "tensor"))(tensor_map=(), optimizer_state=optimizer_state)
    return strategy.override("fc1.*", "tensor").override("fc2.*", "tensor")


def _train_step(mode, optimizer_state=None, max_grad_norm=None):
    mh.set_context(mode=mode, device_num=4)
    model = mh.auto_parallelize(SummedMLP(16, 32, 16), _column_column(optimizer_state))
    optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
    model.train_step(optimizer, X, max_grad_norm=max_grad_norm)
    return model, model.report(optimizer)


def _all_causes(report):
    return [cause for kinds in report.comm_causes.values() for axes in kinds.values() for row in axes.values()
            for cause in row]


def test_tensor_parallel_rows_name_the_matmul_redistribution_and_the_grad_sync(pynative):
    _, report = _train_step("simulation")
    causes = report.comm_causes
    # fc2's weight (16, 32) split on dim 0 is moved to what MatMul needs against the column-split input:
    # one AllToAll forward, and its inverse in the backward, both caused by MatMul's input 1 in Cell fc2
    assert causes["forward"]["AllToAll"] == {"tensor": {"redistribute for MatMul input 1 in fc2": 1}}
    assert causes["backward"]["AllToAll"] == {"tensor": {"redistribute for MatMul input 1 in fc2": 1}}
    # one data-parallel gradient AllReduce per parameter, each named after its parameter, and the
    # global norm's scalar sum over the whole mesh (kept as last_grad_norm; this step does not clip)
    assert causes["backward"]["AllReduce"] == {"data": {f"grad sync of {name}": 1 for name in MLP_PARAMETERS},
                                               "data+tensor": {"grad norm": 1}}
    # every row's causes add up to its count; nothing is unattributed
    for phase, comm in (("forward", report.comm), ("backward", report.comm_backward)):
        for kind, axes in comm.items():
            for axis, row in axes.items():
                assert sum(causes[phase][kind][axis].values()) == row["count"], (phase, kind, axis)
    assert all(_all_causes(report))
    text = str(report)
    assert "caused by" in text
    line = next(line for line in text.splitlines() if "AllToAll" in line and line.strip().startswith("forward"))
    assert line.endswith("redistribute for MatMul input 1 in fc2")
    assert "grad sync of fc1.bias, fc1.weight, fc2.bias (+1 more)" in text
    assert report.to_dict()["comm_causes"] == causes  # the JSON schema adds the field; the others are unchanged
    assert set(report.to_dict()["comm"]["AllToAll"]["tensor"]) == {"count", "bytes", "input_bytes"}


def test_zero1_gather_is_named_as_the_optimizer_s(pynative):
    """Megatron's column (fc1) then row (fc2) parallel MLP, ZeRO-1 over 'data': each parameter gets
    a reduce-scatter and a gather named after it, fc2.bias too: made Partial to meet fc2's Partial
    product, its data-parallel sum is taken on the parameter before that move (as a process does
    under msrun), not as an all-reduce of the Partial copy."""
    mh.set_context(device_num=4)
    strategy = Layout((2, 2), ("data", "tensor"))(tensor_map=(), optimizer_state="data")
    strategy.override("fc1.*", "tensor").override("fc2.weight", None, "tensor")
    model = mh.auto_parallelize(SummedMLP(16, 32, 16), strategy)
    optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
    model.train_step(optimizer, X)
    back = model.report(optimizer).comm_causes["backward"]
    names = ("fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight")
    assert back["AllGather"]["data"] == {f"optimizer ZeRO gather of {name}": 1 for name in names}
    assert back["ReduceScatter"]["data"] == {f"grad sync of {name}": 1 for name in names}
    assert "data" not in back.get("AllReduce", {}), back["AllReduce"]


@pytest.mark.parametrize("optimizer_state", [None, "data"], ids=["plain", "zero1"])
def test_dry_run_names_the_same_causes(pynative, optimizer_state):
    _, sim = _train_step("simulation", optimizer_state)
    _, dry = _train_step("dryrun", optimizer_state)
    assert sim.comm == dry.comm and sim.comm_backward == dry.comm_backward
    assert sim.comm_causes == dry.comm_causes and dry.comm_causes["backward"]


@pytest.mark.parametrize("mode", ["simulation", "dryrun"])
def test_clipping_records_the_norm_all_reduce_once_over_the_mesh(pynative, mode):
    """train_step(max_grad_norm=...) sums each device's squared-norm share over the whole mesh:
    one AllReduce of one float64 per device, 8 bytes in, the ring's 2(n-1)/n x 8 = 12 bytes sent
    over n = 4 devices, caused "clip grad norm"; a step without clipping has no such row."""
    _, clipped = _train_step(mode, max_grad_norm=1.0)
    assert clipped.comm_backward["AllReduce"]["data+tensor"] == {"count": 1, "bytes": 12, "input_bytes": 8}
    assert clipped.comm_causes["backward"]["AllReduce"]["data+tensor"] == {"clip grad norm": 1}
    assert "clip grad norm" in str(clipped)
    plain_model, plain = _train_step(mode)
    assert "clip grad norm" not in _all_causes(plain)  # the norm is still kept (last_grad_norm): "grad norm"
    assert plain.comm_causes["backward"]["AllReduce"]["data+tensor"] == {"grad norm": 1}
    if mode == "simulation":  # clipping by hand after the step adds its own sum to the step's rows
        grads = [Tensor(plain_model.last_gradients[p.name]) for p in plain_model.network.trainable_params()]
        mh.clip_grad_norm(plain_model, grads, 1.0)
        assert plain_model.report().comm_causes["backward"]["AllReduce"]["data+tensor"] == {
            "grad norm": 1, "clip grad norm": 1}


def test_model_output_made_whole_is_its_own_cause(pynative):
    mh.set_context(device_num=4)
    model = mh.auto_parallelize(MLP(16, 32, 16), _column_column())
    model(X)
    # the returned output is gathered over 'data' (the batch) by the model, not by an op of it
    assert model.report().comm_causes["forward"]["AllGather"]["data"] == {
        "model output made whole (returned as a global tensor)": 1}


def test_a_redistribution_the_script_asks_for_is_named_as_such(pynative):
    """Megatron's MLP on tensor 2 returning its Partial output as a DTensor, which the script
    moves itself (split along the batch: a ReduceScatter, gathered back in the backward)."""
    mh.set_context(device_num=2)
    mesh = Layout((2,), ("tensor",))
    model = MLP(16, 32, 16)
    strategy = mesh(tensor_map=()).override("fc1.*", "tensor").override("fc2.weight", None, "tensor")
    sim = simulate(model, strategy, return_dtensor=True)
    ms.grad(lambda x: (sim(x).redistribute(mesh("tensor", None)) ** 2).sum().full_tensor(), grad_position=0)(X)
    causes = sim.report().comm_causes
    assert causes["forward"]["ReduceScatter"] == {"tensor": {DIRECT_CAUSE: 1}}
    assert causes["backward"]["AllGather"] == {"tensor": {DIRECT_CAUSE: 1}}


def test_a_layer_norm_weight_read_through_its_cast_is_named(pynative):
    """nn.LayerNorm casts gamma and beta (`astype`) before its kernel reads them: their gradient
    sums are still named after the parameters."""
    mh.set_context(device_num=2)
    net = nn.SequentialCell([nn.Dense(16, 16), nn.LayerNorm((16,))])
    model = mh.auto_parallelize(net, Layout((2,), ("data",))(tensor_map=()))
    ms.value_and_grad(lambda x: model(x).sum(), None, net.trainable_params())(X)
    assert model.report().comm_causes["backward"]["AllReduce"]["data"] == {
        "grad sync of 0.bias": 1, "grad sync of 0.weight": 1, "grad sync of 1.beta": 1, "grad sync of 1.gamma": 1}


def test_unified_report_rows_carry_their_causes(pynative):
    model, _ = _train_step("simulation")
    report = session_report("simulation", 4)
    # the newest SummedMLP mesh is this test's (meshes are listed oldest first; models of other
    # tests in the same worker may still be alive)
    mesh = [m for m in report["meshes"] if m["source"].startswith("SummedMLP")][-1]
    row = next(r for r in mesh["collectives"] if r["kind"] == "AllToAll" and r["phase"] == "forward")
    assert row["causes"] == {"redistribute for MatMul input 1 in fc2": 1}
    assert "AllToAll      over tensor     x1    512 B sent per device; caused by redistribute for MatMul input 1 in " \
           "fc2" in format_report(report)
    del model


def test_causes_text_lists_parameters_together_and_counts_the_rest():
    causes = {"grad sync of a": 1, "grad sync of b, c": 1, "grad sync of d": 1, "grad sync of e": 1,
              "redistribute for MatMul input 0": 3, "op Div": 1, "": 2, "op Mul": 1}
    assert causes_text(causes) == ("grad sync of a, b, c (+2 more); redistribute for MatMul input 0 x3; "
                                   "not attributed x2; op Div; +1 more causes")
    assert causes_text({}) == ""
