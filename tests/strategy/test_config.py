"""YAML parallel config: the seed's two examples, the mapping onto the mesh, every validation error."""
import copy

import pytest
import yaml

from mindspore_hyper import set_context
from mindspore_hyper.strategy.config import ConfigError, load_parallel_config, parse_split_tuple
from mindspore_hyper.strategy.process_groups import parse_ranks

from paths import CONFIGS  # noqa: E402

# Section 6.1 of the seed, flattened onto one line there; the obvious indentation restored, no mesh.
SEED_PARALLEL = """
parallel_config:
  optimizer:
    sharding: True
    offload: False
  module_level:
  - name: transformer.*
    strategy:
      tensor: (2,1)
      pipeline: 4
  - name: expert_layer
    strategy: mpmd
    devices: [0-63]
"""

# Section 2.3.1 of the seed, indentation restored.
SEED_GROUPS = """
process_groups:
  text_encoder:
    ranks: [0-127]
    hardware: NPU
    batch_size: 32
  vision_encoder:
    ranks: [128-191]
    hardware: NPU
    batch_size: 16
  fusion_layer:
    ranks: 192
    hardware: NPU
scheduler: dynamic
"""

BASE = {"parallel_config": {"device_matrix": [2, 2, 2], "alias_names": ["data", "tensor", "pipeline"],
                            "optimizer": {"sharding": True, "offload": False},
                            "module_level": [{"name": "transformer.*", "strategy": {"tensor": "(2,1)", "pipeline": 2}},
                                             {"name": "expert_layer", "strategy": "mpmd", "devices": ["0-3"]}]}}



def cfg(**changes):
    """BASE with parallel_config keys replaced (None deletes)."""
    out = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            out["parallel_config"].pop(key, None)
        else:
            out["parallel_config"][key] = value
    return out


def module(i, **changes):
    out = cfg()
    out["parallel_config"]["module_level"][i].update(changes)
    return out


def raises_at(path, config, match=None):
    with pytest.raises(ConfigError) as info:
        load_parallel_config(config)
    assert info.value.path == path, str(info.value)
    assert str(info.value).startswith(path + ":")
    if match:
        assert match in str(info.value), str(info.value)
    return info.value


# -- the seed's examples ---------------------------------------------------------------------

def test_seed_parallel_config_file_loads():
    config = load_parallel_config(CONFIGS / "parallel_config.yaml")
    assert config.mesh.device_matrix == (8, 2, 4)
    assert config.mesh.alias_names == ("data", "tensor", "pipeline")
    assert not config.mesh_inferred
    assert config.optimizer_sharding == "data" and config.optimizer_offload is False
    assert config.pipeline_stages == 4
    first, second = config.modules
    assert (first.pattern, first.kind, first.splits, first.pipeline) == ("transformer.*", "spmd", {"tensor": (2, 1)}, 4)
    assert first.tensor_map == ("tensor",)
    assert (second.pattern, second.kind, second.devices) == ("expert_layer", "mpmd", tuple(range(64)))
    assert [g.name for g in config.groups] == ["expert_layer"]
    assert config.source.endswith("parallel_config.yaml")


def test_seed_parallel_config_without_mesh_infers_the_same_mesh():
    config = load_parallel_config(yaml.safe_load(SEED_PARALLEL))
    assert config.mesh_inferred
    assert config.mesh.device_matrix == (8, 2, 4)  # 64 devices from [0-63]; tensor 2, pipeline 4, data the rest
    assert config.mesh.alias_names == ("data", "tensor", "pipeline")
    shipped = load_parallel_config(CONFIGS / "parallel_config.yaml")
    assert config.to_strategy().overrides == shipped.to_strategy().overrides


def test_seed_config_to_strategy():
    strategy = load_parallel_config(CONFIGS / "parallel_config.yaml").to_strategy()
    assert strategy.overrides == {"transformer.*.*": ("tensor",), "expert_layer.*": ()}
    assert strategy.optimizer_state == "data" and strategy.data_axis == "data"
    assert strategy.matching_override("transformer.layers.0.weight") == "transformer.*.*"
    assert strategy.matching_override("transformer.weight") is None  # a parameter of "transformer" itself
    assert strategy.matching_override("expert_layer.w1") == "expert_layer.*"


def test_seed_multimodal_process_groups_file_loads():
    config = load_parallel_config(CONFIGS / "multimodal_process_groups.yaml")
    groups = {g.name: g for g in config.groups}
    assert list(groups) == ["text_encoder", "vision_encoder", "fusion_layer"]
    assert groups["text_encoder"].ranks == tuple(range(128)) and groups["text_encoder"].batch_size == 32
    assert groups["vision_encoder"].ranks == tuple(range(128, 192)) and groups["vision_encoder"].batch_size == 16
    assert groups["fusion_layer"].ranks == (192,) and groups["fusion_layer"].batch_size is None
    assert all(g.hardware == "NPU" and g.scheduler == "dynamic" for g in groups.values())
    assert config.scheduler == "dynamic"
    assert config.mesh.size == 193 and config.mesh.alias_names == ("data",)
    assert load_parallel_config(yaml.safe_load(SEED_GROUPS)).to_dict()["groups"] == config.to_dict()["groups"]


def test_every_shipped_config_loads():
    files = sorted(CONFIGS.glob("*.yaml"))
    docs = {f: yaml.safe_load(f.read_text()) for f in files}
    parallel = [f for f, doc in docs.items() if isinstance(doc, dict) and
                ("parallel_config" in doc or "process_groups" in doc)]
    assert len(parallel) >= 3
    for f in parallel:
        assert load_parallel_config(f).mesh.size >= 1


# -- parsing pieces --------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [("(2,1)", (2, 1)), ("( 2 , 1 )", (2, 1)), ("(4)", (4,)), ("(4,)", (4,)),
                                             ([2, 1], (2, 1)), ((1, 2, 1), (1, 2, 1))])
def test_split_tuples_parse(value, expected):
    assert parse_split_tuple(value, "x") == expected


@pytest.mark.parametrize("value", ["(2,x)", "2;1", [], [2, "1"], [0, 1], 2, [True]])
def test_bad_split_tuple_names_path(value):
    with pytest.raises(ConfigError, match=r"^a\.b: "):
        parse_split_tuple(value, "a.b")


def test_yaml_tuple_string_and_list_are_equivalent():
    as_list = module(0, strategy={"tensor": [2, 1], "pipeline": 2})
    assert load_parallel_config(as_list).modules[0].tensor_map == load_parallel_config(cfg()).modules[0].tensor_map


@pytest.mark.parametrize("value, expected", [(192, (192,)), ("0-3", (0, 1, 2, 3)), (["0-3"], (0, 1, 2, 3)),
                                             ("[4-6]", (4, 5, 6)), ([0, "2-3", 7], (0, 2, 3, 7)), ("1,3", (1, 3))])
def test_rank_specs(value, expected):
    assert parse_ranks(value, "r") == expected


def test_yaml_rank_range_is_parsed_from_text():
    raw = yaml.safe_load("parallel_config:\n  module_level:\n  - {name: e, strategy: mpmd, devices: [8-11]}\n")
    assert load_parallel_config(raw).groups[0].ranks == (8, 9, 10, 11)


def test_module_split_counts_map_to_tensor_map():
    config = load_parallel_config(module(0, strategy={"tensor": "(1,2)", "data": "(2,1)"}))
    assert config.modules[0].tensor_map == ("data", "tensor")
    config = load_parallel_config(module(0, strategy={"tensor": "(2,1)", "data": "(2,1)"}))
    assert config.modules[0].tensor_map == (("data", "tensor"),)  # one dimension over two axes, mesh order
    config = load_parallel_config(module(0, strategy={"tensor": "(1,1,1)"}))
    assert config.modules[0].tensor_map == ()


def test_inferred_mesh_uses_context_device_num():
    set_context(device_num=16)
    raw = {"parallel_config": {"module_level": [{"name": "a.*", "strategy": {"tensor": "(1,4)"}}]}}
    config = load_parallel_config(raw)
    assert config.mesh.device_matrix == (4, 4) and config.mesh.alias_names == ("data", "tensor")
    raw["parallel_config"]["device_num"] = 8
    assert load_parallel_config(raw).mesh.device_matrix == (2, 4)


def test_config_from_file_path(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg()))
    assert load_parallel_config(str(path)).pipeline_stages == 2
    assert load_parallel_config(path).source == str(path)


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)


# -- validation errors, each naming the YAML path --------------------------------------------

def test_unknown_top_level_key():
    raises_at("paralel_config", {"paralel_config": {}}, "unknown top-level key")


def test_empty_root():
    raises_at("<root>", {"scheduler": "dynamic"}, "parallel_config")


def test_unknown_parallel_config_key():
    raises_at("parallel_config.devices", cfg(devices=[0]), "unknown key")


def test_unknown_optimizer_key():
    raises_at("parallel_config.optimizer.shard", cfg(optimizer={"shard": True}), "unknown key")


def test_unknown_module_key():
    raises_at("parallel_config.module_level[0].stages", module(0, stages=4), "unknown key")


def test_unknown_strategy_key_is_not_a_mesh_alias():
    raises_at("parallel_config.module_level[0].strategy.model", module(0, strategy={"model": "(2,1)"}), "mesh alias")


def test_unknown_process_group_key():
    raw = {"process_groups": {"text": {"ranks": 0, "gpu": 1}}}
    raises_at("process_groups.text.gpu", raw, "unknown key")


def test_reversed_rank_range():
    raises_at("parallel_config.module_level[1].devices[0]", module(1, devices=["64-0"]), "reversed")


def test_reversed_rank_range_from_yaml_text():
    raw = yaml.safe_load(SEED_PARALLEL.replace("[0-63]", "[64-0]"))
    raises_at("parallel_config.module_level[1].devices[0]", raw, "reversed")


@pytest.mark.parametrize("devices", [["a-b"], [1.5], [True], ["0-x"], [-1], []])
def test_non_integer_or_empty_ranks(devices):
    err = load_error(module(1, devices=devices))
    assert err.path.startswith("parallel_config.module_level[1].devices")


def load_error(config):
    with pytest.raises(ConfigError) as info:
        load_parallel_config(config)
    return info.value


def test_repeated_rank():
    raises_at("parallel_config.module_level[1].devices", module(1, devices=[1, "0-3"]), "more than once")


def test_overlapping_mpmd_entries():
    raw = cfg()
    raw["parallel_config"]["module_level"].append({"name": "other", "strategy": "mpmd", "devices": ["3-5"]})
    err = raises_at("parallel_config.module_level[2].devices", raw, "overlap")
    assert "parallel_config.module_level[1].devices" in str(err) and "rank 3" in str(err)


def test_overlapping_process_groups():
    raw = yaml.safe_load(SEED_GROUPS.replace("[128-191]", "[127-191]"))
    err = raises_at("process_groups.vision_encoder.ranks", raw, "overlap")
    assert "process_groups.text_encoder.ranks" in str(err)


def test_process_group_overlapping_an_mpmd_entry():
    raw = cfg()
    raw["process_groups"] = {"vision": {"ranks": [2]}}
    raises_at("process_groups.vision.ranks", raw, "parallel_config.module_level[1].devices")


def test_more_devices_than_the_mesh():
    err = raises_at("parallel_config.module_level[1].devices", module(1, devices=["0-8"]), "outside the mesh")
    assert "8 devices" in str(err)


def test_process_group_beyond_explicit_mesh():
    raw = cfg()
    raw["process_groups"] = {"late": {"ranks": 9}}
    raises_at("process_groups.late.ranks", raw, "outside the mesh")


def test_more_devices_than_explicit_device_num():
    raw = yaml.safe_load(SEED_PARALLEL)
    raw["parallel_config"]["device_num"] = 32
    raises_at("parallel_config.module_level[1].devices", raw, "outside the mesh")


def test_split_count_must_be_one_or_axis_size():
    err = raises_at("parallel_config.module_level[0].strategy.tensor", module(0, strategy={"tensor": "(4,1)"}))
    assert "expected 1 or the size of axis 'tensor' (2)" in str(err)


def test_one_axis_splits_one_dimension():
    raises_at("parallel_config.module_level[0].strategy.tensor", module(0, strategy={"tensor": "(2,2)"}),
              "at most one dimension")


def test_bad_split_tuple_in_yaml():
    raises_at("parallel_config.module_level[0].strategy.tensor", module(0, strategy={"tensor": "(2,a)"}))


def test_pipeline_must_equal_axis_size():
    raises_at("parallel_config.module_level[0].strategy.pipeline", module(0, strategy={"pipeline": 4}),
              "must equal that axis size")


def test_pipeline_needs_a_pipeline_axis():
    raw = module(0, strategy={"tensor": "(2,1)", "pipeline": 2})
    raw["parallel_config"]["alias_names"] = ["data", "tensor", "seq"]
    raises_at("parallel_config.module_level[0].strategy.pipeline", raw, "no pipeline axis")


@pytest.mark.parametrize("stages", [0, -1, True, 1.5])
def test_pipeline_must_be_positive_int(stages):
    raises_at("parallel_config.module_level[0].strategy.pipeline", module(0, strategy={"pipeline": stages}))


def test_conflicting_pipeline_counts_in_inferred_mesh():
    raw = {"parallel_config": {"device_num": 8, "module_level": [
        {"name": "a", "strategy": {"pipeline": 2}}, {"name": "b", "strategy": {"pipeline": 4}}]}}
    raises_at("parallel_config.module_level[1].strategy.pipeline", raw, "one pipeline")


def test_pipeline_axis_cannot_also_split():
    raw = module(0, strategy={"pipeline": 2})
    raw["parallel_config"]["module_level"].append({"name": "x", "strategy": {"pipeline": "(2,1)"}})
    raises_at("parallel_config.module_level[2].strategy.pipeline", raw, "pipeline stages")


def test_default_tensor_map_cannot_use_pipeline_axis_with_stages():
    raises_at("parallel_config.tensor_map", cfg(tensor_map=["pipeline"]), "pipeline")


def test_inferred_mesh_must_divide_device_count():
    raw = {"parallel_config": {"device_num": 6, "module_level": [{"name": "a", "strategy": {"tensor": "(4,1)"}}]}}
    raises_at("parallel_config.device_num", raw, "does not divide")


def test_device_num_must_match_device_matrix():
    raises_at("parallel_config.device_num", cfg(device_num=16), "8 devices")


@pytest.mark.parametrize("key, value", [("device_matrix", [2, 0, 2]), ("alias_names", ["data", "data", "p"]),
                                        ("alias_names", ["data", "tensor"])])
def test_bad_mesh(key, value):
    raises_at(f"parallel_config.{key}", cfg(**{key: value}))


def test_alias_names_without_device_matrix():
    raises_at("parallel_config.device_matrix", cfg(device_matrix=None), "missing")


def test_devices_only_on_mpmd_entries():
    raises_at("parallel_config.module_level[0].devices", module(0, devices=[0]), "mpmd")


def test_mpmd_entry_needs_devices():
    raw = cfg()
    del raw["parallel_config"]["module_level"][1]["devices"]
    raises_at("parallel_config.module_level[1].devices", raw, "missing")


@pytest.mark.parametrize("strategy", ["spmd", 3, {}, None])
def test_bad_strategy_value(strategy):
    raises_at("parallel_config.module_level[0].strategy", module(0, strategy=strategy))


def test_module_name_required():
    raises_at("parallel_config.module_level[0].name", module(0, name=""))


def test_optimizer_sharding_values():
    assert load_parallel_config(cfg(optimizer={"sharding": "tensor"})).optimizer_sharding == "tensor"
    assert load_parallel_config(cfg(optimizer={"sharding": False})).optimizer_sharding is None
    raises_at("parallel_config.optimizer.sharding", cfg(optimizer={"sharding": "nope"}), "mesh alias")
    raises_at("parallel_config.optimizer.sharding", cfg(optimizer={"sharding": 3}))
    raises_at("parallel_config.optimizer.offload", cfg(optimizer={"offload": "yes"}))


def test_optimizer_sharding_true_needs_a_data_axis():
    raw = cfg(alias_names=["dp", "tensor", "pipeline"])
    raises_at("parallel_config.optimizer.sharding", raw, "data axis")
    raw["parallel_config"]["data_axis"] = "dp"
    assert load_parallel_config(raw).optimizer_sharding == "dp"


def test_bad_data_axis():
    raises_at("parallel_config.data_axis", cfg(data_axis="batch"))


def test_bad_tensor_maps():
    raises_at("parallel_config.tensor_map[1]", cfg(tensor_map=[None, "model"]), "mesh alias")
    raises_at("parallel_config.tensor_map", cfg(tensor_map=["data", "data"]), "more than once")
    raises_at("parallel_config.input_map[0]", cfg(input_map=[3]))


def test_parameter_level_entries():
    raw = cfg(parameter_level=[{"name": "head.weight", "tensor_map": ["tensor", None]}])
    config = load_parallel_config(raw)
    assert config.parameters[0].explicit and config.parameters[0].tensor_map == ("tensor", None)
    assert list(config.to_strategy().overrides)[-1] == "head.weight"
    raises_at("parallel_config.parameter_level[0].tensor_map", cfg(parameter_level=[{"name": "h"}]), "missing")
    raises_at("parallel_config.parameter_level[0].layout",
              cfg(parameter_level=[{"name": "h", "tensor_map": [], "layout": 1}]), "unknown key")


@pytest.mark.parametrize("key, value, path", [
    ("hardware", "TPU", "process_groups.g.hardware"), ("batch_size", 0, "process_groups.g.batch_size"),
    ("batch_size", "32", "process_groups.g.batch_size"), ("scheduler", "fast", "process_groups.g.scheduler"),
    ("modules", "", "process_groups.g.modules")])
def test_bad_process_group_fields(key, value, path):
    raises_at(path, {"process_groups": {"g": {"ranks": [0], key: value}}})


def test_process_group_needs_ranks_and_a_mapping():
    raises_at("process_groups.g.ranks", {"process_groups": {"g": {"hardware": "NPU"}}}, "missing")
    raises_at("process_groups.scheduler", {"process_groups": {"g": {"ranks": 0}, "scheduler": "dynamic"}},
              "top-level")


def test_bad_top_level_scheduler():
    raises_at("scheduler", {"process_groups": {"g": {"ranks": 0}}, "scheduler": "fifo"})


def test_invalid_yaml_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("parallel_config: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_parallel_config(path)


def _without_devices_key():
    raw = cfg()
    raw["parallel_config"]["module_level"][0].pop("strategy")
    return raw


@pytest.mark.parametrize("raw, path", [
    ([1, 2], "<root>"),
    ({"parallel_config": [1]}, "parallel_config"),
    (cfg(pipeline_axis=""), "parallel_config.pipeline_axis"),
    (cfg(module_level={"name": "a"}), "parallel_config.module_level"),
    (cfg(module_level=["transformer.*"]), "parallel_config.module_level[0]"),
    (_without_devices_key(), "parallel_config.module_level[0].strategy"),
    (module(0, strategy={1: "(2,1)"}), "parallel_config.module_level[0].strategy.1"),
    (cfg(device_num=0), "parallel_config.device_num"),
    (cfg(device_matrix=[2, 4], alias_names=None), "parallel_config.alias_names"),
    ({"parallel_config": {"device_num": 8, "module_level": [{"name": "a", "strategy": {"pipeline": 2}},
                                                            {"name": "b", "strategy": {"pipeline": "(1,2)"}}]}},
     "parallel_config.module_level"),
    (cfg(tensor_map="data"), "parallel_config.tensor_map"),
    (cfg(optimizer=[True]), "parallel_config.optimizer"),
    (cfg(parameter_level={"name": "a"}), "parallel_config.parameter_level"),
    (cfg(parameter_level=["a"]), "parallel_config.parameter_level[0]"),
    (cfg(parameter_level=[{"name": 3, "tensor_map": []}]), "parallel_config.parameter_level[0].name"),
    ({"process_groups": [1]}, "process_groups"),
    ({"process_groups": {1: {"ranks": 0}}}, "process_groups.1"),
    ({"process_groups": {"g": {"ranks": "-1-3"}}}, "process_groups.g.ranks"),
])
def test_remaining_validation_errors_name_their_path(raw, path):
    raises_at(path, raw)


def test_default_alias_names_for_three_axes():
    config = load_parallel_config(cfg(alias_names=None))
    assert config.mesh.alias_names == ("data", "tensor", "pipeline")
