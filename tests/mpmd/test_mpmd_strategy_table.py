"""The MPMD job's StrategyTable: every group's rows resolved once into it, each group runs its slices."""
import json
from dataclasses import replace

import pytest

import mindspore_hyper as mh
from mindspore_hyper.mpmd import scale_groups
from mindspore_hyper.schedule.rebalance import GroupSharePlan, ShareMove, ShareUnit
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.strategy import group_table
from mindspore_hyper.strategy.config import load_parallel_config
from mindspore_hyper.strategy.group_table import group_slice
from mindspore_hyper.strategy.resolve import resolve_strategy
from mpmd_models import Multimodal, multimodal_batch
from paths import CONFIGS

pytestmark = pytest.mark.usefixtures("pynative")


@pytest.fixture
def mpmd(clean_context):
    clean_context.set_context(hyper_mpmd=True, device_num=7)
    return clean_context


def static_seed_config():
    """The seed's three groups scaled to 7 devices: text 0-3, vision 4-5, fusion 6; static scheduler."""
    cfg = scale_groups(load_parallel_config(CONFIGS / "multimodal_process_groups.yaml"), 7)
    return replace(cfg, groups=[replace(g, scheduler="static") for g in cfg.groups], scheduler="static")


TENSOR_2 = Strategy(Layout([2], ["tensor"]), tensor_map=("tensor", None), data_axis=None)


def test_job_table_holds_every_groups_rows_and_each_group_runs_its_slice(mpmd, monkeypatch):
    """One resolution per group Cell, at the build, into the job's table; the runners' tables are
    slices of it, equal to the group's own resolution of the Cell (what each group resolved
    before); the report and its JSON carry the group rows."""
    calls = []
    real = group_table.resolve_strategy
    monkeypatch.setattr(group_table, "resolve_strategy", lambda cell, s, **kw: calls.append(s) or real(cell, s, **kw))
    model = mh.auto_parallelize(Multimodal(), static_seed_config(), mode="simulation",
                                group_strategies={"vision_encoder": TENSOR_2})
    assert len(calls) == 3  # one Cell per group
    table = model.table
    ranks = {"text_encoder": (0, 1, 2, 3), "vision_encoder": (4, 5), "fusion_layer": (6,)}
    assert table.group_ranks == ranks
    assert sorted(r.name for r in table) == sorted(n for n, _ in model.network.parameters_and_names())
    for name, runner in model.runners.items():
        rows = table.group_rows(name)
        assert {r.name for r in rows} == {f"{name}.{n}" for n, _ in runner.cells[name].parameters_and_names()}
        assert all(r.devices == ranks[name] and r.layout.mesh == runner.placement.strategy.mesh for r in rows)
        before = resolve_strategy(runner.cells[name], runner.placement.strategy).check_shapes()
        ran = runner.models[name].table
        assert list(ran) == list(before) and ran.to_dict() == before.to_dict()
        assert list(group_slice(table, name, name)) == list(before)
    assert table["vision_encoder.0.weight"].local_shape == (8, 12)  # the group's own tensor parallel
    assert table["vision_encoder.0.weight"].tensor_map == ("tensor", None)
    model(*multimodal_batch())
    assert len(calls) == 3  # the forward slices nothing again
    as_dict = table.to_dict()
    assert as_dict["group_meshes"]["vision_encoder"]["alias_names"] == ("tensor",)
    assert as_dict["group_meshes"]["vision_encoder"]["ranks"] == [4, 5]
    report = json.loads(json.dumps(model.report().to_dict()))["mpmd"]["groups"]
    assert report["vision_encoder"]["mesh"] == {"device_matrix": [2], "alias_names": ["tensor"]}
    assert report["vision_encoder"]["parameters"]["vision_encoder.0.weight"]["local_shape"] == [8, 12]
    assert report["text_encoder"]["parameters"]["text_encoder.0.weight"]["devices"] == [0, 1, 2, 3]
    assert {n: len(g["parameters"]) for n, g in report.items()} == {
        "text_encoder": 4, "vision_encoder": 4, "fusion_layer": 2}
    text = str(model.report())
    assert "tensor 2" in text and "data 4" in text
    assert "group vision_encoder: tensor maps on its own mesh (2,) ('tensor',) (ranks [4, 5])" in str(table)


def test_a_device_move_resolves_the_moved_groups_rows_again(clean_context):
    clean_context.set_context(hyper_mpmd=True, device_num=7)
    cfg = load_parallel_config({"process_groups": {
        "text_encoder": {"ranks": [0, 1]}, "vision_encoder": {"ranks": ["2-5"]}, "fusion_layer": {"ranks": 6}}})
    model = mh.auto_parallelize(Multimodal(), cfg, mode="simulation")
    groups = ("text_encoder", "vision_encoder", "fusion_layer")
    model.apply(GroupSharePlan(ShareUnit.DEVICES, groups, (2, 4, 1), (4, 2, 1),
                               (ShareMove("vision_encoder", "text_encoder", 2),), (1.0, 0.2, 0.1), (0.5, 0.4, 0.1),
                               "test"))
    table = model.table
    assert table.group_ranks["text_encoder"] == (0, 1, 4, 5) and table.group_ranks["vision_encoder"] == (2, 3)
    assert {r.devices for r in table.group_rows("text_encoder")} == {(0, 1, 4, 5)}
    assert table.group_strategies["text_encoder"] is model.placements()["text_encoder"].strategy
    assert list(model.runners["text_encoder"].models["text_encoder"].table) == list(
        group_slice(table, "text_encoder", "text_encoder"))
    assert model.runners["text_encoder"].models["text_encoder"].mesh.size == 4


def test_a_bad_group_strategy_is_refused_naming_the_group_and_field(mpmd):
    unmatched = Strategy(Layout([2], ["tensor"]), tensor_map=(), data_axis=None).override("nope.*", "tensor")
    with pytest.raises(ValueError, match=r"^group_strategies\['vision_encoder'\] \(group 'vision_encoder', Cell "
                                         r"'vision_encoder', parameter names relative to it\): override pattern "
                                         r"'nope\.\*' matches no parameter"):
        mh.auto_parallelize(Multimodal(), static_seed_config(), mode="simulation",
                            group_strategies={"vision_encoder": unmatched})
    uneven = Strategy(Layout([4], ["tensor"]), tensor_map=(), data_axis=None).override("0.weight", "tensor")
    with pytest.raises(ValueError, match=r"^group_strategies\['text_encoder'\] \(group 'text_encoder', Cell "
                                         r"'text_encoder', .*override '0.weight' for parameter '0.weight': dimension 0 "
                                         r"of shape \(18, 8\) has size 18, not divisible by 4"):
        mh.auto_parallelize(Multimodal(hidden=18), static_seed_config(), mode="simulation",
                            group_strategies={"text_encoder": uneven})


def test_group_slice_of_a_group_not_resolved_is_refused():
    table = resolve_strategy(Multimodal(), static_seed_config())
    with pytest.raises(ValueError, match=r"holds no rows of device group 'text_encoder' \(groups resolved: \[\]\)"):
        group_slice(table, "text_encoder", "text_encoder")
