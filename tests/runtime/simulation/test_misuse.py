"""Misuse a new user makes is refused with the fix named, never trained through silently: an
optimizer not built on `optimizer_parameters()`, a model that returns logits instead of a loss
(issue 42). The msrun side of the optimizer check (ZeRO-1 slices, real state sizes in the report)
is in tests/runtime/distributed/test_distributed_msrun.py (case "2x1+zero")."""
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from mindspore_hyper import Layout
from mindspore_hyper.runtime.simulation import simulate

from sim_models import MLP

X = Tensor(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32))
Y = Tensor(np.random.default_rng(1).integers(0, 16, (8,)).astype(np.int32))
MESH = Layout((2, 4), ("data", "tensor"))


@pytest.fixture(autouse=True)
def _eight_devices(clean_context):
    clean_context.set_context(device_num=8)


def megatron(optimizer_state=None):
    s = MESH(tensor_map=(), optimizer_state=optimizer_state)
    s.override("*fc1.*", "tensor").override("*fc2.weight", None, "tensor")
    return s


def test_train_step_refuses_logits_naming_shape_and_loss_wrapper():
    model = MLP()
    par = simulate(model, megatron())
    before = {n: p.asnumpy().copy() for n, p in model.parameters_and_names()}
    optimizer = nn.Adam(par.optimizer_parameters(), learning_rate=0.1)
    with pytest.raises(ValueError, match=r"train_step: the model returned a tensor of shape \(8, 16\), "
                                         r"not a scalar loss.*nn\.WithLossCell"):
        par.train_step(optimizer, X)
    for n, p in model.parameters_and_names():  # nothing was updated
        np.testing.assert_array_equal(p.asnumpy(), before[n])


def test_train_step_refuses_a_tuple_of_outputs():
    class Two(nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = MLP()

        def construct(self, x):
            y = self.net(x)
            return y.mean(), y

    par = simulate(Two(), megatron())
    with pytest.raises(ValueError, match=r"returned 2 outputs \(tuple\).*WithLossCell"):
        par.train_step(nn.SGD(par.optimizer_parameters(), learning_rate=0.1), X)


def test_with_loss_cell_trains_after_the_refusal():
    """The fix the message names works, in the same process, after the refused call."""
    model = MLP()
    par = simulate(model, megatron("data"))
    optimizer = nn.Adam(par.optimizer_parameters(), learning_rate=0.1)
    with pytest.raises(ValueError, match="not a scalar loss"):
        par.train_step(optimizer, X)
    loss_net = nn.WithLossCell(MLP(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    par = simulate(loss_net, megatron("data"))
    optimizer = nn.Adam(par.optimizer_parameters(), learning_rate=0.05)
    losses = [float(par.train_step(optimizer, X, Y).asnumpy()) for _ in range(3)]
    assert losses[-1] < losses[0]


def test_optimizer_of_another_model_is_refused_in_train_step_and_report():
    par = simulate(MLP(), megatron())
    other = nn.Adam(MLP().trainable_params(), learning_rate=0.1)
    with pytest.raises(ValueError, match=r"train_step: the optimizer updates 4 Parameter\(s\) that are not this "
                                         r"model's \(first: 'fc1.weight', shape \(32, 16\)\).*optimizer_parameters\(\)"):
        par.train_step(other, X)
    par(X)
    with pytest.raises(ValueError, match=r"report: the optimizer updates 4 Parameter"):
        par.report(other)
    # an optimizer over a larger model (a pipeline's, over every stage) reports this model's states
    mine = par.optimizer_parameters()
    both = nn.Adam(mine + [Parameter(Tensor(np.ones(3, np.float32)), name="other_stage.weight")], learning_rate=0.1)
    assert par.report(both).memory[0]["optimizer_states"] == par.report(nn.Adam(mine)).memory[0]["optimizer_states"]


def test_full_parameters_where_zero1_slices_them_are_refused(monkeypatch):
    """The check train_step and report share, with the ZeRO-1 slices a process holds under msrun
    (here: the slices stand in for DistributedModel's; the msrun test runs the real ones)."""
    model = MLP()
    par = simulate(model, megatron("data"))
    full = list(model.trainable_params())
    slices = [Parameter(Tensor(p.asnumpy()[: p.shape[0] // 2]), name=p.name) for p in full]
    monkeypatch.setattr(par, "optimizer_parameters", lambda: slices)
    wrong = nn.Adam(full, learning_rate=0.1)  # the ordinary MindSpore way
    for call, where in ((lambda: par.train_step(wrong, X), "train_step"), (lambda: par.report(wrong), "report")):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"{where}: the optimizer was built on the model's full parameters")
        assert "optimizer_state='data' (ZeRO-1)" in message
        assert "'fc1.weight': shape (32, 16) here, its slice (16, 16)" in message
        assert "nn.Adam(parallel_model.optimizer_parameters()" in message
    par.check_optimizer(nn.Adam(slices, learning_rate=0.1))  # built on the slices: accepted


def test_optimizer_on_a_subset_of_the_parameters_is_accepted():
    """Fine-tuning a part of the model is not misuse."""
    model = nn.WithLossCell(MLP(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    par = simulate(model, megatron())
    head = [p for p in par.optimizer_parameters() if "fc2" in p.name]
    frozen = {p.name: p.asnumpy().copy() for p in par.optimizer_parameters() if "fc1" in p.name}
    par.train_step(nn.SGD(head, learning_rate=0.1), X, Y)
    for p in model.trainable_params():
        if p.name in frozen:
            np.testing.assert_array_equal(p.asnumpy(), frozen[p.name])


# -- errors that name the fix ---------------------------------------------------------------------

def test_batch_that_does_not_divide_over_the_data_axis_says_which_batches_work():
    par = simulate(MLP(), MESH(tensor_map=()))
    with pytest.raises(ValueError) as info:
        par(X[:3])
    message = str(info.value)
    assert message.startswith("input of shape (3, 16) cannot be split as declared: the batch (dimension 0) is 3, "
                              "which does not divide over the 2 devices of mesh axis 'data'")
    assert "a multiple of 2 (2, 4, 6, ...; here 2 or 4)" in message and "drop_remainder=True" in message


def test_sequence_that_does_not_divide_over_the_context_axis_says_pad():
    strategy = Layout((2, 2), ("data", "cp"))(tensor_map=(), context_parallel="cp")
    assert strategy.input_split_error((4, 8)) is None
    message = strategy.input_split_error((4, 7))
    assert message.startswith("the sequence (dimension 1) is 7 long, which does not divide over the 2 devices of the "
                              "context-parallel mesh axis 'cp': pad it to a multiple of 2 (here 8)")
    assert "the batch (dimension 0) is 1" in Layout((2,), ("data",))(tensor_map=()).input_split_error((1, 4))
    assert "here 2)" in Layout((2,), ("data",))(tensor_map=()).input_split_error((1, 4))
