"""MPMD device groups in simulation: placement, numerics against one device, timeline, errors."""
import json
from dataclasses import replace

import numpy as np
import pytest
import mindspore as ms
from mindspore import nn, ops

import mindspore_hyper as mh
from mindspore_hyper.mpmd import GroupTimeline, MPMDModel, scale_groups
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.strategy.config import load_parallel_config
from mpmd_models import (Multimodal, assert_same_training, make_pair, multimodal_batch, train_parallel,
                         train_reference)
from paths import CONFIGS

pytestmark = pytest.mark.usefixtures("pynative")

SEED_CONFIG = CONFIGS / "multimodal_process_groups.yaml"


@pytest.fixture
def mpmd(clean_context):
    clean_context.set_context(hyper_mpmd=True)
    return clean_context


def seed_config_on(devices, scheduler=None):
    cfg = scale_groups(load_parallel_config(SEED_CONFIG), devices)
    if scheduler is not None:
        cfg = replace(cfg, groups=[replace(g, scheduler=scheduler) for g in cfg.groups], scheduler=scheduler)
    return cfg


def test_hyper_mpmd_off_refuses_groups(clean_context):
    clean_context.set_context(device_num=7)
    with pytest.raises(ValueError, match=r"set_context\(hyper_mpmd=True\)") as err:
        mh.auto_parallelize(Multimodal(), seed_config_on(7), mode="simulation")
    assert "process_groups.text_encoder" in str(err.value)


def test_seed_config_scaled_keeps_proportions():
    cfg = seed_config_on(7)
    assert [(g.name, g.ranks) for g in cfg.groups] == [
        ("text_encoder", (0, 1, 2, 3)), ("vision_encoder", (4, 5)), ("fusion_layer", (6,))]
    assert cfg.mesh.size == 7 and cfg.scheduler == "dynamic"
    with pytest.raises(ValueError, match="device_num=2"):
        scale_groups(load_parallel_config(SEED_CONFIG), 2)


def test_seed_multimodal_config_trains_like_one_device(mpmd):
    """The seed's three groups (scaled to 7 devices, batch_size 32 text / 16 images as in the
    seed): losses, first gradients and parameters after 4 Adam steps equal one device."""
    mpmd.set_context(device_num=7)
    net, ref = make_pair(Multimodal)
    model = mh.auto_parallelize(net, seed_config_on(7), mode="simulation")
    assert isinstance(model, MPMDModel)
    assert {n: p.ranks for n, p in model.placements().items()} == {
        "text_encoder": (0, 1, 2, 3), "vision_encoder": (4, 5), "fusion_layer": (6,)}
    # each group runs on its own mesh: 4 and 2 shards of the batch, one device for the fusion
    assert model.runners["text_encoder"].models["text_encoder"].mesh.size == 4
    assert model.runners["vision_encoder"].models["vision_encoder"].mesh.size == 2
    batches = [multimodal_batch(seed=s) for s in range(4)]
    # scheduler: dynamic may move devices between the groups meanwhile: the numbers stay
    assert_same_training(train_parallel(model, batches), train_reference(ref, batches))
    assert sorted(r for p in model.placements().values() for r in p.ranks) == list(range(7))


def test_timeline_overlaps_independent_groups(mpmd, tmp_path):
    mpmd.set_context(device_num=7)
    model = mh.auto_parallelize(Multimodal(), seed_config_on(7), mode="simulation")
    model(*multimodal_batch())
    report = model.report()
    section = report.mpmd  # the MPMD part of the StepReport
    tasks = {t.lane: t for t in section.timeline.spans}
    text, vision, fusion = tasks["text_encoder"], tasks["vision_encoder"], tasks["fusion_layer"]
    assert text.start == vision.start == 0.0  # no data dependency: concurrent
    assert fusion.start == pytest.approx(max(text.end, vision.end))  # reads both
    assert (text.args["index"], vision.args["index"]) in section.timeline.overlaps()
    assert section.timeline.makespan < section.timeline.serial_time
    # the fusion input (concat of the encoders' features) crossed into the fusion group
    assert section.cross_group_bytes == {("<between groups>", "fusion_layer"): 16 * 32 * 4}
    # memory per global rank: a text rank holds the text encoder's parameters, rank 6 the fusion's
    text_params = sum(p.asnumpy().nbytes for p in model.network.text_encoder.trainable_params())
    assert report.memory[0]["parameters"] == text_params and set(report.memory) == set(range(7))
    assert section.memory == {rank: row["total"] for rank, row in report.memory.items()}
    path = tmp_path / "mpmd.json"
    section.timeline.to_chrome_trace(str(path))
    threads = {e["args"]["name"] for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "M"}
    assert threads == {"text_encoder", "vision_encoder", "fusion_layer"}


def test_training_step_timeline_has_measured_backwards(mpmd):
    """train_step adds each group's backward: the fusion's first (after the whole forward), then
    the two encoders' concurrently (each reads only the fusion's backward)."""
    mpmd.set_context(device_num=7)
    model = mh.auto_parallelize(Multimodal(), seed_config_on(7, "static"), mode="simulation")
    model.train_step(nn.Adam(model.optimizer_parameters()), *multimodal_batch())
    task = {t.label: t for t in model.report().mpmd.timeline.spans}
    assert set(task) == {f"{g} {p}" for g in ("text_encoder", "vision_encoder", "fusion_layer")
                         for p in ("forward", "backward")}
    fusion, text, vision = (task[f"{g} backward"] for g in ("fusion_layer", "text_encoder", "vision_encoder"))
    assert all(t.duration > 0 for t in (fusion, text, vision))
    assert fusion.start == task["fusion_layer forward"].end
    assert text.start == vision.start == fusion.end
    assert tuple(sorted((text.args["index"], vision.args["index"]))) in model.report().mpmd.timeline.overlaps()


class EncoderHead(nn.Cell):
    """MindSpore layers the runtime was not written for: Conv2d, BatchNorm-free pooling, Embedding."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.SequentialCell(nn.Conv2d(3, 4, 3, pad_mode="same"), nn.ReLU(), nn.Flatten())
        self.table = nn.Embedding(10, 8)
        self.head = nn.Dense(4 * 6 * 6 + 8, 3)

    def construct(self, x, ids, y):
        feats = ops.concat((self.encoder(x), self.table(ids).mean(1)), -1)
        return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")(self.head(feats), y)


def mpmd_entries_config():
    return load_parallel_config({"parallel_config": {"device_matrix": [6], "alias_names": ["data"], "module_level": [
        {"name": "encoder", "strategy": "mpmd", "devices": [0, 1]},
        {"name": "table", "strategy": "mpmd", "devices": ["2-3"]},
        {"name": "head", "strategy": "mpmd", "devices": ["4-5"]}]}})


def eh_batches(n=3):
    rng = np.random.default_rng(3)
    return [(ms.Tensor(rng.standard_normal((4, 3, 6, 6)).astype(np.float32)),
             ms.Tensor(rng.integers(0, 10, (4, 5)).astype(np.int32)),
             ms.Tensor(rng.integers(0, 3, (4,)).astype(np.int32))) for _ in range(n)]


def test_mpmd_module_entries_with_mindspore_layers(mpmd):
    mpmd.set_context(device_num=6)
    net, ref = make_pair(EncoderHead)
    model = mh.auto_parallelize(net, mpmd_entries_config(), mode="simulation")
    batches = eh_batches()
    assert_same_training(train_parallel(model, batches), train_reference(ref, batches))
    tasks = [t for t in model.report().mpmd.timeline.spans if t.label.endswith("forward")]
    assert [t.lane for t in tasks] == ["encoder", "table", "head"]
    assert tasks[0].start == tasks[1].start == 0.0 and tasks[2].args["depends_on"] == (0, 1)


def test_group_with_its_own_tensor_parallel_strategy(mpmd):
    """The vision group runs tensor parallel over its 2 ranks (explicit Strategy); same numbers."""
    mpmd.set_context(device_num=7)
    net, ref = make_pair(Multimodal)
    tp = Strategy(Layout([2], ["tensor"]), tensor_map=("tensor", None), data_axis=None)
    model = mh.auto_parallelize(net, seed_config_on(7, "static"), mode="simulation",
                                group_strategies={"vision_encoder": tp})
    vision = model.runners["vision_encoder"].models["vision_encoder"]
    assert vision.table["0.weight"].local_shape == (8, 12)  # names relative to the group's Cell
    batches = [multimodal_batch(seed=s) for s in range(3)]
    assert_same_training(train_parallel(model, batches), train_reference(ref, batches))


def test_bad_group_inputs_are_refused(mpmd):
    mpmd.set_context(device_num=7)
    cfg = seed_config_on(7)
    with pytest.raises(ValueError, match=r"group_strategies\['vision_encoder'\]: mesh \(4,\) has 4 devices but group "
                                         r"'vision_encoder' has 2 ranks"):
        mh.auto_parallelize(Multimodal(), cfg, mode="simulation",
                            group_strategies={"vision_encoder": Strategy(Layout([4], ["data"]))})
    with pytest.raises(ValueError, match="group_strategies: 'audio' is not a device group"):
        mh.auto_parallelize(Multimodal(), cfg, mode="simulation", group_strategies={"audio": None})
    with pytest.raises(ValueError, match="scheduler: dynamic moves devices"):
        mh.auto_parallelize(Multimodal(), cfg, mode="simulation",
                            group_strategies={"vision_encoder": Strategy(Layout([2], ["data"]))})
    with pytest.raises(ValueError, match="return_dtensor=True: an MPMD model returns global tensors"):
        mh.auto_parallelize(Multimodal(), cfg, mode="simulation", return_dtensor=True)
    model = mh.auto_parallelize(Multimodal(), cfg, mode="simulation")
    with pytest.raises(ValueError, match=r"process_groups.text_encoder.batch_size: 32, but Cell 'text_encoder' got "
                                         r"input 0 with batch 16"):
        model(*multimodal_batch(images=8))


def test_parameter_outside_every_group_is_refused(mpmd):
    class Extra(Multimodal):
        def __init__(self):
            super().__init__()
            self.scale = nn.Dense(4, 4)

    mpmd.set_context(device_num=7)
    with pytest.raises(ValueError, match="parameter 'scale.weight' belongs to no device group"):
        mh.auto_parallelize(Extra(), seed_config_on(7), mode="simulation")


def test_nested_groups_are_refused(mpmd):
    mpmd.set_context(device_num=4)
    cfg = load_parallel_config({"process_groups": {"outer": {"ranks": [0, 1], "modules": "text_encoder"},
                                                   "inner": {"ranks": [2], "modules": "text_encoder.0"},
                                                   "rest": {"ranks": [3], "modules": "*_*"}}})
    with pytest.raises(ValueError, match="Cell 'text_encoder.0' is also run by group 'outer'"):
        mh.auto_parallelize(Multimodal(), cfg, mode="simulation")


def test_distributed_mode_checks_groups(mpmd):
    """In a plain process (a job of one): the groups must fit the job, dynamic moves and ZeRO-1
    are refused under msrun, hyper_mpmd gates it; one group on the one process trains exactly."""
    with pytest.raises(ValueError, match="groups span 7 devices but the job has 1 processes"):
        mh.auto_parallelize(Multimodal(), seed_config_on(7, "static"), mode="distributed")
    one = {"parallel_config": {"device_num": 1}, "process_groups": {"everything": {"ranks": 0, "modules": "*"}},
           "scheduler": "dynamic"}
    with pytest.raises(ValueError, match="process_groups.everything.scheduler: dynamic .* simulation mode only"):
        mh.auto_parallelize(Multimodal(), load_parallel_config(one), mode="distributed")
    one["scheduler"] = "static"
    with pytest.raises(ValueError, match=r"process_groups.everything.hardware: NPU, but this process \(rank 0\) runs "
                                         "on CPU"):
        mh.auto_parallelize(Multimodal(), load_parallel_config(one), mode="distributed")
    one["process_groups"]["everything"]["hardware"] = "CPU"
    net, ref = make_pair(Multimodal)
    model = mh.auto_parallelize(net, load_parallel_config(one), mode="distributed")
    assert model.placements()["everything"].cells == ("text_encoder", "vision_encoder", "fusion_layer")
    batches = [multimodal_batch(seed=s) for s in range(2)]
    assert_same_training(train_parallel(model, batches), train_reference(ref, batches))
    mpmd.set_context(hyper_mpmd=False)
    with pytest.raises(ValueError, match="hyper_mpmd=True"):
        mh.auto_parallelize(Multimodal(), seed_config_on(7), mode="distributed")


def test_group_timeline_rules():
    tl = GroupTimeline(("a", "b"))
    first = tl.add("a", "a0", 2.0)
    tl.add("b", "b0", 1.0)
    third = tl.add("b", "b1", 1.0, depends_on=[first])
    assert tl.spans[third].start == 2.0 and tl.makespan == 3.0 and tl.serial_time == 4.0
    assert tl.overlaps() == [(0, 1)]
    with pytest.raises(ValueError, match="group='c'"):
        tl.add("c", "x", 1.0)
    with pytest.raises(ValueError, match=r"depends_on=\[5\]"):
        tl.add("a", "x", 1.0, depends_on=[5])
    with pytest.raises(ValueError, match="duration=-1"):
        tl.add("a", "x", -1)
