"""Dynamic rebalancing between MPMD groups: applied device moves keep the numerics."""
import numpy as np
import pytest
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper.schedule.rebalance import GroupSharePlan, ShareMove, ShareUnit
from mindspore_hyper.strategy.config import load_parallel_config
from mpmd_models import Multimodal, assert_same_training, make_pair, multimodal_batch, train_parallel, train_reference
from tolerances import assert_adam_training_close, reduction_length, training_rtol

pytestmark = pytest.mark.usefixtures("pynative")


def config(scheduler="dynamic", fusion_scheduler=None):
    fusion = {"ranks": 6} if fusion_scheduler is None else {"ranks": 6, "scheduler": fusion_scheduler}
    return load_parallel_config({"process_groups": {
        "text_encoder": {"ranks": [0, 1]}, "vision_encoder": {"ranks": ["2-5"]}, "fusion_layer": fusion},
        "scheduler": scheduler})


@pytest.fixture
def mpmd(clean_context):
    clean_context.set_context(hyper_mpmd=True, device_num=7)
    return clean_context


def batches(n):
    return [multimodal_batch(images=60, captions_per_image=1, seed=s) for s in range(n)]


def test_hand_made_move_is_applied_and_keeps_training_numerics(mpmd):
    plan_groups = ("text_encoder", "vision_encoder", "fusion_layer")
    net, ref = make_pair(lambda: Multimodal(text_layers=2))
    model = mh.auto_parallelize(net, config("static"), mode="simulation")
    data = batches(3)
    opt = nn.Adam(model.optimizer_parameters(), learning_rate=1e-2)  # one optimizer across the move
    losses = [float(model.train_step(opt, *b)) for b in data[:2]]
    with pytest.raises(ValueError, match=r"plan.before=\[4, 2, 1\]: the groups .* have \[2, 4, 1\] devices now"):
        model.apply(GroupSharePlan(ShareUnit.DEVICES, plan_groups, (4, 2, 1), (2, 4, 1),
                                   (ShareMove("text_encoder", "vision_encoder", 2),), (1, 1, 1), (1, 1, 1), "x"))
    model.apply(GroupSharePlan(ShareUnit.DEVICES, plan_groups, (2, 4, 1), (4, 2, 1),
                               (ShareMove("vision_encoder", "text_encoder", 2),), (1.0, 0.2, 0.1), (0.5, 0.4, 0.1),
                               "test"))
    assert model.placements()["text_encoder"].ranks == (0, 1, 4, 5)
    assert model.placements()["vision_encoder"].ranks == (2, 3)
    assert model.runners["text_encoder"].models["text_encoder"].mesh.size == 4
    losses += [float(model.train_step(opt, *b)) for b in data[2:]]
    ref_losses, _, ref_params = train_reference(ref, data)
    reduction = reduction_length(net.trainable_params(), 64)  # Adam-aware bounds: tests/tolerances.py
    np.testing.assert_allclose(losses, ref_losses, rtol=training_rtol(reduction, len(data)))
    for p in net.trainable_params():
        assert_adam_training_close(p.asnumpy(), ref_params[p.name], 1e-2, len(data), reduction, err_msg=p.name)
    model(*data[0])
    assert {t.lane for t in model.report().mpmd.timeline.spans} == {"text_encoder", "vision_encoder", "fusion_layer"}


def test_dynamic_scheduler_moves_devices_to_the_heavy_group_between_steps(mpmd):
    """A text encoder ~8x heavier than the vision encoder on half its devices: the measured group
    times make the scheduler move devices to it, and training still equals one device. The
    fusion group stays static (per-group scheduler), so only text and vision trade devices."""
    net, ref = make_pair(lambda: Multimodal(text_layers=8, hidden=32))
    model = mh.auto_parallelize(net, config(fusion_scheduler="static"), mode="simulation")
    assert model.rebalancing.rebalancer.groups == ("text_encoder", "vision_encoder")
    data = batches(4)
    result = train_parallel(model, data)
    assert_same_training(result, train_reference(ref, data))
    applied = [r for r in model.rebalances if r.applied]
    assert applied, [r.plan.reason for r in model.rebalances]
    first = applied[0].plan
    text = first.groups.index("text_encoder")
    assert first.after[text] > first.before[text]
    sizes = {n: p.size for n, p in model.placements().items()}
    assert sizes["text_encoder"] > 2 and sizes["fusion_layer"] == 1 and sum(sizes.values()) == 7
    ranks = sorted(r for p in model.placements().values() for r in p.ranks)
    assert ranks == list(range(7))  # disjoint, none lost


def test_static_scheduler_never_moves(mpmd):
    model = mh.auto_parallelize(Multimodal(text_layers=8, hidden=32), config("static"), mode="simulation")
    train_parallel(model, batches(3))
    assert model.rebalancing is None and model.rebalances == []
    assert model.placements()["text_encoder"].ranks == (0, 1)


def test_split_that_does_not_divide_the_batch_is_replaced_by_the_best_divisible_one(mpmd):
    """Measured: text 10 s of work on 2 devices, vision 0.4 s on 4, fusion 0.1 s on 1. The
    planner's split (5, 1, 1) cannot split a batch of 12 over 5 devices; (4, 2, 1) is the best
    split dividing it (bottleneck 2.5 s instead of 5 s, 2 devices moved) and is applied."""
    model = mh.auto_parallelize(Multimodal(), config(), mode="simulation")
    batches = {"text_encoder": [12], "vision_encoder": [12], "fusion_layer": [12]}
    record = model.rebalancing.step(1, {"text_encoder": 10.0, "vision_encoder": 0.4, "fusion_layer": 0.1}, batches)
    assert record.applied and record.plan.after == (4, 2, 1)
    assert "group 'text_encoder' would run batch 12 on 5 devices" in record.note
    assert model.placements()["text_encoder"].ranks == (0, 1, 4, 5)
    assert model.rebalancing.rebalancer.split == (4, 2, 1)  # committed: the planner knows the new split


def test_no_divisible_split_helps_then_nothing_moves(mpmd):
    model = mh.auto_parallelize(Multimodal(), config(), mode="simulation")
    batches = {"text_encoder": [14], "vision_encoder": [12], "fusion_layer": [12]}  # 1, 2 or 7 devices
    record = model.rebalancing.step(1, {"text_encoder": 10.0, "vision_encoder": 0.4, "fusion_layer": 0.1}, batches)
    assert not record.applied and "no split with divisible device counts" in record.note
    assert model.placements()["text_encoder"].ranks == (0, 1)
