"""Simulation report figures against hand-computed values, memory checks, plot, bad input."""
import warnings

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn
from mindspore.ops import operations as P

import mindspore_hyper as mh
from mindspore_hyper.shard import Layout
from mindspore_hyper.runtime.simulation import DeviceMemoryError, simulate

from sim_models import MLP

MESH = Layout((2, 4), ("data", "tensor"))
X = Tensor(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32))


@pytest.fixture(autouse=True)
def _eight_devices(clean_context):
    clean_context.set_context(device_num=8)
    yield


def column_row_mlp(optimizer_state=None):
    model = MLP(16, 32, 16)
    s = MESH(tensor_map=(), optimizer_state=optimizer_state)
    s.override("fc1.*", "tensor")  # column parallel: weight (32,16) split on dim 0, bias split
    s.override("fc2.weight", None, "tensor")  # row parallel: weight (16,32) split on dim 1
    return model, simulate(model, s)


def test_parameter_and_gradient_bytes_hand_computed():
    _, sim = column_row_mlp()
    sim(X)
    report = sim.report()
    # fc1.weight (8,16)*4 = 512, fc1.bias (8,)*4 = 32, fc2.weight (16,8)*4 = 512, fc2.bias (16,)*4 = 64
    for rank in range(8):
        assert report.memory[rank]["parameters"] == 512 + 32 + 512 + 64
        assert report.memory[rank]["gradients"] == 1120


def test_row_parallel_allreduce_bytes_hand_computed():
    _, sim = column_row_mlp()
    sim(X)
    comm = sim.report().comm
    # fc2's output is Partial over 'tensor'; local (batch 8/2, 16) float32 = 256 B;
    # ring AllReduce over 4 devices sends 2*(4-1)/4*256 = 384 B per device
    assert comm["AllReduce"] == {"tensor": {"count": 1, "bytes": 384, "input_bytes": 256}}
    # returning the global output gathers the batch over 'data': (2-1)*256 = 256 B
    assert comm["AllGather"] == {"data": {"count": 1, "bytes": 256, "input_bytes": 256}}


def test_optimizer_state_bytes_with_zero1_sharding_hand_computed():
    model, sim = column_row_mlp(optimizer_state="data")
    sim(X)
    adam = nn.Adam(model.trainable_params(), learning_rate=1e-3)
    # states split further along 'data': fc1.weight (4,16)=256, fc1.bias (4,)=16,
    # fc2.weight (8,8)=256, fc2.bias (8,)=32; Adam keeps two (m, v)
    expected = 2 * (256 + 16 + 256 + 32)
    assert sim.report(adam).memory[0]["optimizer_states"] == expected
    assert sim.report().memory[0]["optimizer_states"] == expected  # default: 2 states per parameter
    _, unsharded = column_row_mlp(optimizer_state=None)
    unsharded(X)
    assert unsharded.report().memory[0]["optimizer_states"] == 2 * 1120


def test_peak_activation_bytes_tracked():
    _, sim = column_row_mlp()
    sim(X)
    peak = sim.report().memory[0]["activations_peak"]
    # at least the input shard (4,16) and fc1's output shard (4,8) are alive together
    assert peak >= 256 + 128
    assert sim.accounting.live_bytes <= peak


def test_memory_over_budget_warns_or_raises():
    _, sim = column_row_mlp()
    sim(X)
    mh.set_context(device_memory="1KiB", memory_check="warn")
    with pytest.warns(ResourceWarning, match=r"exceed device_memory=1.00 KiB: device 0 needs"):
        report = sim.report()
    assert set(report.over_budget()) == set(range(8))
    mh.set_context(memory_check="error")
    with pytest.raises(DeviceMemoryError, match="parameters 1.09 KiB"):
        sim.report()
    mh.set_context(device_memory="1GiB")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sim.report().over_budget() == {}


def test_report_table_dict_and_plot(tmp_path):
    _, sim = column_row_mlp(optimizer_state="data")
    sim(X)
    report = sim.report()
    text = str(report)
    assert "AllReduce" in text and "tensor" in text and "virtual devices" in text
    d = report.to_dict()
    assert d["memory"][3]["parameters"] == 1120 and d["mesh"] == {"data": 2, "tensor": 4}
    assert d["comm_time_estimate_s"] > 0
    path = report.plot(str(tmp_path / "report.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


# -- bad input ---------------------------------------------------------------------------------

def test_shard_layout_with_other_mesh_is_refused():
    other = Layout((4, 2), ("a", "b")).to_mindspore()

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(16, 16)
            self.add = P.Add().shard((other("a", "b"), other("a", "b")))

        def construct(self, x):
            return self.add(x, self.fc(x))

    with pytest.raises(ValueError, match=r"Add.shard\(\): layout device_matrix \(4, 2\) differs from the model's mesh \(2, 4\)"):
        simulate(Net(), MESH(tensor_map=()))


def test_shard_int_strategy_that_fits_no_axis_is_refused():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.relu = P.ReLU().shard(((3, 1),))

        def construct(self, x):
            return self.relu(x)

    with pytest.raises(ValueError, match="split 3 ways"):
        simulate(Net(), MESH(tensor_map=()))


def test_indivisible_override_and_input():
    s = MESH(tensor_map=(), overrides={"fc1.weight": (None, ("data", "tensor"))})
    with pytest.raises(ValueError, match="fc1.weight.*not divisible by 8"):
        simulate(MLP(16, 32, 16).__class__(12, 32, 16), s)
    sim = simulate(MLP(), MESH(tensor_map=()))
    with pytest.raises(ValueError, match=r"input of shape \(3, 16\) cannot be split"):
        sim(Tensor(np.zeros((3, 16), np.float32)))


def test_strategy_naming_unknown_parameter():
    s = MESH(tensor_map=(), overrides={"fc3.weight": ("tensor",)})
    with pytest.raises(ValueError, match="'fc3.weight' names no parameter"):
        simulate(MLP(), s)


def test_device_num_must_match_mesh():
    mh.set_context(device_num=4)
    with pytest.raises(ValueError, match=r"mesh \(2, 4\) has 8 devices but device_num=4"):
        simulate(MLP(), MESH(tensor_map=()))


def test_data_parallel_gradient_sync_hand_computed():
    mh.set_context(device_num=8)
    model = MLP(16, 32, 16)
    sim = simulate(model, Layout((8,), ("data",))(tensor_map=()))
    sim(X)
    assert sim.report().comm_backward == {}  # no backward ran: nothing is reported for it
    ms.value_and_grad(lambda x: sim(x).sum(), None, model.trainable_params())(X)
    back = sim.report().comm_backward
    # one gradient AllReduce per parameter over 8 replicas: 2*(7/8) of
    # fc1.weight 2048 B + fc1.bias 128 B + fc2.weight 2048 B + fc2.bias 64 B = 4288 B
    assert back["AllReduce"]["data"] == {"count": 4, "bytes": 7504, "input_bytes": 4288}
    # the gathered output's gradient is whole on every device: its shard is a local slice
    assert set(back) == {"AllReduce"}

    zero_model = MLP(16, 32, 16)
    zero = simulate(zero_model, Layout((8,), ("data",))(tensor_map=(), optimizer_state="data"))
    ms.value_and_grad(lambda x: zero(x).sum(), None, zero_model.trainable_params())(X)
    back = zero.report().comm_backward
    # ZeRO-1: gradients reduce-scattered to the optimizer shards, updated parameters all-gathered
    assert back["AllGather"]["data"] == {"count": 4, "bytes": 4288 * 7 // 8, "input_bytes": 4288 // 8}
    assert back["ReduceScatter"]["data"] == {"count": 4, "bytes": 4288 * 7 // 8, "input_bytes": 4288}
    assert "AllReduce" not in back


def test_graph_mode_is_refused_with_a_clear_error():
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(ValueError, match="PYNATIVE_MODE"):
            simulate(MLP(), MESH(tensor_map=()))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_auto_parallelize_defaults_to_simulation_and_can_return_dtensors():
    from mindspore_hyper import auto_parallelize
    from mindspore_hyper.runtime.simulation import DTensor, SimulatedModel

    model = MLP()
    sim = auto_parallelize(model, MESH(tensor_map=("tensor",)))  # mode from the context: simulation on CPU
    assert isinstance(sim, SimulatedModel)
    raw = auto_parallelize(model, MESH(tensor_map=("tensor",)), return_dtensor=True)
    out = raw(X)
    assert isinstance(out, DTensor) and out.shape == (8, 16)
    np.testing.assert_allclose(out.full_tensor().asnumpy(), model(X).asnumpy(), rtol=1e-5, atol=1e-6)


def _megatron_mlp(sequence_parallel: bool):
    """Column-parallel fc1 and row-parallel fc2 over a 2-device tensor axis; with sequence
    parallelism the input arrives split along the batch/sequence dimension and `.shard()`
    asks for it whole before fc1 (Megatron's AllGather) and split again after fc2."""
    mesh = Layout((2,), ("tensor",))
    model = MLP(16, 32, 16)
    strategy = mesh(tensor_map=(), input_map=("tensor",) if sequence_parallel else None)
    strategy.override("fc1.*", "tensor").override("fc2.weight", None, "tensor")
    if sequence_parallel:
        model.fc1.matmul.shard(((1, 1), (2, 1)))
        model.fc2.matmul.shard(((1, 2), (1, 2)))
    return model, mesh, strategy


def test_backward_communication_of_megatron_mlp_is_observed():
    mh.set_context(device_num=2)
    model, _, strategy = _megatron_mlp(False)
    sim = simulate(model, strategy)
    grads = ms.grad(lambda x: (sim(x) ** 2).sum(), grad_position=0, weights=model.trainable_params())(X)
    report = sim.report()
    activation = 8 * 16 * 4  # the (8, 16) float32 activation around the MLP
    # forward: the row-parallel output is all-reduced; backward: the input's gradient (Megatron's f)
    assert report.comm == {"AllReduce": {"tensor": {"count": 1, "bytes": activation, "input_bytes": activation}}}
    assert report.comm_backward == {"AllReduce": {"tensor": {"count": 1, "bytes": activation,
                                                             "input_bytes": activation}}}
    reference = ms.grad(lambda x: (model(x) ** 2).sum(), grad_position=0, weights=model.trainable_params())(X)
    for got, want in zip([grads[0], *grads[1]], [reference[0], *reference[1]]):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)


def test_backward_communication_of_sequence_parallel_mlp_is_observed():
    mh.set_context(device_num=2)
    model, mesh, strategy = _megatron_mlp(True)
    sim = simulate(model, strategy, return_dtensor=True)

    def loss(x):
        out = sim(x).redistribute(mesh("tensor", None))  # Partial -> split along the sequence
        return (out ** 2).sum().full_tensor()

    grads = ms.grad(loss, grad_position=0, weights=model.trainable_params())(X)
    report = sim.report()
    half, whole = 4 * 16 * 4, 8 * 16 * 4  # one device's half of the activation, and all of it
    assert report.comm["AllGather"] == {"tensor": {"count": 1, "bytes": half, "input_bytes": half}}
    assert report.comm["ReduceScatter"] == {"tensor": {"count": 1, "bytes": half, "input_bytes": whole}}
    # backward: the gathered input's gradients are reduce-scattered, the scattered output's gathered
    assert report.comm_backward == {
        "AllGather": {"tensor": {"count": 1, "bytes": half, "input_bytes": half}},
        "ReduceScatter": {"tensor": {"count": 1, "bytes": half, "input_bytes": whole}},
    }
    reference = ms.grad(lambda x: (model(x) ** 2).sum(), grad_position=0, weights=model.trainable_params())(X)
    for got, want in zip([grads[0], *grads[1]], [reference[0], *reference[1]]):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)
