"""MPMDModel speaks the model protocol of ParallelModel (simulation): `report(optimizer)` is a
StepReport with the MPMD section inside, `train_step` refuses an output that is not a scalar
loss, clips to a global norm over every group (equal to one device's `ops.clip_by_global_norm`)
and scales the loss; bad or unsupported options are refused by name. Under msrun:
test_mpmd_msrun.py."""
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import mindspore as ms
from mindspore import amp, nn, ops

import mindspore_hyper as mh
from mindspore_hyper.mpmd import MPMDSection, scale_groups
from mindspore_hyper.mpmd.gradient_norm import mpmd_grad_norm
from mindspore_hyper.mpmd.group_placement import check_unshared_parameters, place_groups
from mindspore_hyper.runtime.report import StepReport
from mindspore_hyper.strategy.config import load_parallel_config
from mpmd_models import Multimodal, make_pair, multimodal_batch
from paths import CONFIGS
from tolerances import U32, gradient_tolerance, reduction_length, training_rtol

pytestmark = pytest.mark.usefixtures("pynative")

LR, MOMENTUM, STEPS = 0.1, 0.9, 3
TOKENS = 32  # the largest batch of rows a weight gradient sums over (32 captions)


@pytest.fixture
def mpmd(clean_context):
    clean_context.set_context(hyper_mpmd=True, device_num=7)
    return clean_context


def groups_model(net):
    """`net` on the seed's three device groups (7 devices), static scheduler (no device moves)."""
    cfg = scale_groups(load_parallel_config(CONFIGS / "multimodal_process_groups.yaml"), 7)
    cfg = replace(cfg, groups=[replace(g, scheduler="static") for g in cfg.groups], scheduler="static")
    return mh.auto_parallelize(net, cfg, mode="simulation")


def grads_of(model, batch):
    """Single-device loss and gradients of a plain model."""
    loss, grads = ms.value_and_grad(model, None, model.trainable_params())(*batch)
    return float(loss), grads


def exact_norm(grads) -> float:
    return float(np.sqrt(sum(np.sum(np.asarray(g.asnumpy(), np.float64) ** 2) for g in grads)))


def mindspore_norm(grads) -> float:
    """The global norm as ops.clip_by_global_norm computes it (float32 square sums, AddN, Sqrt)."""
    return float(ops.sqrt(ops.addn([ops.square(g).sum().reshape((1,)) for g in grads])).asnumpy()[0])


class Logits(Multimodal):
    """The multimodal model without its loss: returns (images, 4) outputs."""

    def construct(self, text, image, target):
        pooled = self.text_encoder(text).reshape(image.shape[0], -1, self.hidden).mean(1)
        return self.fusion_layer(ops.concat((pooled, self.vision_encoder(image)), -1))


def test_report_is_a_step_report_with_the_mpmd_section(mpmd):
    model = groups_model(Multimodal())
    opt = nn.Adam(model.optimizer_parameters(), learning_rate=1e-2)
    model.train_step(opt, *multimodal_batch())
    report = model.report(opt)
    assert isinstance(report, StepReport) and isinstance(report.mpmd, MPMDSection)
    assert set(report.memory) == set(range(7)) and report.simulated and report.backward_ran
    # every rank of a data-parallel group holds its group's parameters whole, Adam two states of each
    for name, runner in model.runners.items():
        nbytes = sum(p.asnumpy().nbytes for cell in runner.cells.values() for p in cell.trainable_params())
        for rank in runner.placement.ranks:
            row = report.memory[rank]
            assert (row["parameters"], row["gradients"], row["optimizer_states"]) == (nbytes, nbytes, 2 * nbytes)
            assert row["total"] == sum(row[k] for k in ("parameters", "gradients", "optimizer_states",
                                                        "activations_peak"))
            assert report.mpmd.memory[rank] == row["total"]
    # the groups' gradient all-reduces, named by group; the single-device fusion group has none; and the
    # global norm's float64 sum over the job's 7 devices (8 bytes in, the ring's 2(n-1)/n x 8 = 13 sent)
    axes = {axis for axes in report.comm_backward.values() for axis in axes}
    assert axes == {"data@text_encoder", "data@vision_encoder", "data"}
    assert report.comm_backward["AllReduce"]["data"] == {"count": 1, "bytes": 13, "input_bytes": 8}
    assert report.comm_causes["backward"]["AllReduce"]["data"] == {"grad norm": 1}
    assert [t.label for t in report.mpmd.timeline.spans][-1].endswith("backward")
    assert report.step_seconds > 0 and set(report.mpmd.groups) == {"text_encoder", "vision_encoder", "fusion_layer"}
    text = str(report)
    assert "MPMD groups:" in text and "<between groups> -> fusion_layer: 2048 bytes" in text
    assert json.loads(json.dumps(report.to_dict()))["mpmd"]["cross_group_bytes"] == {
        "<between groups>->fusion_layer": 2048}
    foreign = nn.Adam(Multimodal().trainable_params())
    with pytest.raises(ValueError, match="report: the optimizer updates 10 Parameter.*optimizer_parameters"):
        model.report(foreign)


class LossAndLogits(Logits):
    """Returns (loss, outputs): two outputs."""

    def construct(self, text, image, target):
        out = super().construct(text, image, target)
        return ((out - target) ** 2).mean(), out


@pytest.mark.parametrize("make, what", [(Logits, r"a tensor of shape \(16, 4\), not a scalar loss"),
                                        (LossAndLogits, r"2 outputs \(tuple\)")])
def test_train_step_refuses_an_output_that_is_not_a_scalar_loss(mpmd, make, what):
    model = groups_model(make())
    opt = nn.SGD(model.optimizer_parameters(), LR)
    before = [p.asnumpy().copy() for p in opt.parameters]
    with pytest.raises(ValueError, match=f"train_step: the model returned {what}; train_step needs the model to "
                                         f"return the loss: wrap the network with its loss .*nn.WithLossCell"):
        model.train_step(opt, *multimodal_batch())
    assert all(np.array_equal(p.asnumpy(), b) for p, b in zip(opt.parameters, before))  # nothing updated
    assert len(model(*multimodal_batch())) in (16, 2)  # a plain forward still returns the outputs


def test_grad_norm_equals_mindspore_on_the_same_gradients(mpmd):
    """Given the single-device gradients, the norm over the groups counts every element once:
    equal to the float64 norm (to its rounding) and to ops.clip_by_global_norm's float32 one
    within 1e-6 relative (a float32 sum of a few thousand squares)."""
    net, ref = make_pair(Multimodal)
    model = groups_model(net)
    _, grads = grads_of(ref, multimodal_batch())
    norm = mpmd_grad_norm(model, grads)
    assert norm == pytest.approx(exact_norm(grads), rel=1e-12)
    assert norm == pytest.approx(mindspore_norm(grads), rel=1e-6)
    # each group's parameters alone fall short: the norm spans the groups
    assert all(exact_norm([g for p, g in zip(ref.trainable_params(), grads) if p.name.startswith(n)]) < 0.99 * norm
               for n in model.runners)
    with pytest.raises(ValueError, match=r"grads: got 9 gradients, expected one per trainable parameter .*\(10,"):
        mpmd_grad_norm(model, grads[:-1])
    with pytest.raises(ValueError, match=r"grads: the gradient of 'text_encoder.0.weight' has shape \(8,\), expected "
                                         r"the parameter's shape \(16, 8\)"):
        mpmd_grad_norm(model, [g[0] if i == 0 else g for i, g in enumerate(grads)])


@pytest.mark.parametrize("max_norm", [0.05, 100.0])
def test_train_step_clips_like_single_device(mpmd, max_norm):
    """`STEPS` momentum steps with max_grad_norm equal the single-device loop with
    ops.clip_by_global_norm: the loss and norm of every step and the trained parameters, within
    the float32 bound of a different reduction order (tests/tolerances.py)."""
    net, ref = make_pair(Multimodal)
    model = groups_model(net)
    batches = [multimodal_batch(seed=s) for s in range(STEPS)]
    reduction = reduction_length(ref.trainable_params(), TOKENS)
    ref_opt = nn.Momentum(ref.trainable_params(), LR, MOMENTUM)
    before = [p.asnumpy().copy() for p in ref.trainable_params()]
    ref_losses, ref_norms, first_tol = [], [], None
    for batch in batches:
        loss, grads = grads_of(ref, batch)
        first_tol = first_tol or gradient_tolerance([g.asnumpy() for g in grads], reduction)
        ref_losses.append(loss)
        ref_norms.append(exact_norm(grads))
        ref_opt(ops.clip_by_global_norm(grads, max_norm))
    opt = nn.Momentum(model.optimizer_parameters(), LR, MOMENTUM)
    for step, batch in enumerate(batches):
        loss = float(model.train_step(opt, *batch, max_grad_norm=max_norm))
        rtol = training_rtol(reduction, step + 1)
        assert loss == pytest.approx(ref_losses[step], rel=rtol)
        if step == 0:  # same parameters: the norm differs by at most the gradients' rounding
            assert abs(model.last_grad_norm - ref_norms[0]) <= float(np.linalg.norm(np.concatenate(
                [t.ravel() for t in first_tol])))
        assert model.last_grad_norm == pytest.approx(ref_norms[step], rel=rtol)
        assert not model.last_step_skipped
    assert (ref_norms[0] > max_norm) == (max_norm == 0.05)  # both sides of the limit are exercised
    assert model.report(opt).comm_causes["backward"]["AllReduce"]["data"] == {"clip grad norm": 1}  # the last step's
    rtol = training_rtol(reduction, STEPS)
    for p, start in zip(ref.trainable_params(), before):
        got, want = net.parameters_dict()[p.name].asnumpy(), p.asnumpy()
        err = np.linalg.norm(got - want)
        assert err <= rtol * np.linalg.norm(want - start) + 4 * U32 * np.linalg.norm(want), (p.name, err)


class Tied(nn.Cell):
    """Two Dense layers sharing one weight, each on its own device group."""

    def __init__(self):
        super().__init__()
        self.a = nn.Dense(8, 8)
        self.b = nn.Dense(8, 8)
        self.b.weight = self.a.weight

    def construct(self, x, y):
        return ((self.b(ops.tanh(self.a(x))) - y) ** 2).mean()


def tied_config():
    return load_parallel_config({"parallel_config": {"device_matrix": [4], "alias_names": ["data"], "module_level": [
        {"name": "a", "strategy": "mpmd", "devices": [0, 1]}, {"name": "b", "strategy": "mpmd", "devices": ["2-3"]}]}})


def test_a_weight_shared_by_two_groups_counts_once(mpmd):
    """In simulation a Parameter the Cells of two groups share is one Parameter: updated once
    (the optimizer gets it once), its gradient (both uses summed) counted once in the norm; under
    msrun, where each group would update its own copy, it is refused by name."""
    mpmd.set_context(device_num=4)
    net, ref = make_pair(Tied)
    model = mh.auto_parallelize(net, tied_config(), mode="simulation")
    assert [p.name for p in model.optimizer_parameters()] == ["a.weight", "a.bias", "b.bias"]
    rng = np.random.default_rng(0)
    batches = [tuple(ms.Tensor(rng.standard_normal((8, 8)).astype(np.float32)) for _ in range(2)) for _ in range(2)]
    reduction = reduction_length(ref.trainable_params(), 8)
    opt, ref_opt = nn.SGD(model.optimizer_parameters(), LR), nn.SGD(ref.trainable_params(), LR)
    for step, batch in enumerate(batches):
        loss = float(model.train_step(opt, *batch, max_grad_norm=0.01))
        ref_loss, grads = grads_of(ref, batch)
        rtol = training_rtol(reduction, step + 1)
        assert model.last_grad_norm == pytest.approx(exact_norm(grads), rel=rtol) and model.last_grad_norm > 0.01
        assert loss == pytest.approx(ref_loss, rel=rtol)
        ref_opt(ops.clip_by_global_norm(grads, 0.01))
    for p in ref.trainable_params():
        got, want = net.parameters_dict()[p.name].asnumpy(), p.asnumpy()
        assert np.linalg.norm(got - want) <= training_rtol(reduction, 2) * np.linalg.norm(want), p.name
    with pytest.raises(ValueError, match="parameter 'a.weight' is used by group 'a' \\(Cell 'a'\\) and group 'b' "
                                         "\\(Cell 'b'\\): under msrun each group's processes would update their "
                                         "own copy"):
        check_unshared_parameters(net, place_groups(net, tied_config()))


def test_loss_scale_trains_like_unscaled_and_skips_an_overflow(mpmd):
    """A static scale of 2**10 (exact in float32: the gradients are unscaled exactly) trains as
    one device without scaling; a scale that overflows float32 skips the update and the dynamic
    scaler halves its scale."""
    net, ref = make_pair(Multimodal)
    model = groups_model(net)
    batches = [multimodal_batch(seed=s) for s in range(2)]
    reduction = reduction_length(ref.trainable_params(), TOKENS)
    ref_opt = nn.Momentum(ref.trainable_params(), LR, MOMENTUM)
    ref_losses = []
    for batch in batches:
        loss, grads = grads_of(ref, batch)
        ref_losses.append(loss)
        ref_opt(grads)
    opt = nn.Momentum(model.optimizer_parameters(), LR, MOMENTUM)
    for step, batch in enumerate(batches):
        loss = float(model.train_step(opt, *batch, loss_scale=2.0 ** 10))
        assert loss == pytest.approx(ref_losses[step], rel=training_rtol(reduction, step + 1))
    for p in ref.trainable_params():
        got, want = net.parameters_dict()[p.name].asnumpy(), p.asnumpy()
        assert np.linalg.norm(got - want) <= training_rtol(reduction, 2) * np.linalg.norm(want) + 4 * U32, p.name
    # targets of 1e6: the output's gradient (about 2e6 / 64 per element) times 3e38 overflows float32
    scaler = amp.DynamicLossScaler(3e38, 2, 1000)
    text, image, target = batches[0]
    before = [p.asnumpy().copy() for p in opt.parameters]
    model.train_step(opt, text, image, target * 1e6, loss_scale=scaler)
    assert model.last_step_skipped and not math.isfinite(model.last_grad_norm)
    assert all(np.array_equal(p.asnumpy(), b) for p, b in zip(opt.parameters, before))
    assert float(scaler.scale_value.asnumpy()) == pytest.approx(1.5e38, rel=1e-6)


def test_bad_and_unsupported_options_are_refused_by_name(mpmd):
    model = groups_model(Multimodal())
    opt = nn.SGD(model.optimizer_parameters(), LR)
    before = [p.asnumpy().copy() for p in opt.parameters]
    with pytest.raises(ValueError, match="accumulation_steps=2 is not supported by the MPMD model yet; pass the whole "
                                         "batch to one step"):
        model.train_step(opt, *multimodal_batch(), accumulation_steps=2)
    for bad in (0, -1.0, float("nan"), "1.0", True):
        with pytest.raises(ValueError, match="max_grad_norm=.*expected a finite number > 0"):
            model.train_step(opt, *multimodal_batch(), max_grad_norm=bad)
    with pytest.raises(ValueError, match="loss_scale=0.5: expected None, a number >= 1"):
        model.train_step(opt, *multimodal_batch(), loss_scale=0.5)
    with pytest.raises(ValueError, match=r"train_step: the optimizer updates 10 Parameter\(s\) that are not this "
                                         r"model's"):
        model.train_step(nn.SGD(Multimodal().trainable_params(), LR), *multimodal_batch())
    assert all(np.array_equal(p.asnumpy(), b) for p, b in zip(opt.parameters, before))  # nothing ran
