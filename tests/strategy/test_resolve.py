"""resolve_strategy: per-parameter tables from a Strategy or a YAML config on small nn.Cell models."""
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, nn

from mindspore_hyper.shard import Layout
from mindspore_hyper.strategy.config import ConfigError, load_parallel_config
from mindspore_hyper.strategy.resolve import StrategyTable, _partition, nearest_names, resolve_strategy

from paths import CONFIGS  # noqa: E402
MESH3 = {"device_matrix": [2, 2, 2], "alias_names": ["data", "tensor", "pipeline"]}



class Block(nn.Cell):
    def __init__(self, d=16):
        super().__init__()
        self.ln = nn.LayerNorm((d,))
        self.fc1 = nn.Dense(d, 4 * d)
        self.fc2 = nn.Dense(4 * d, d)

    def construct(self, x):
        return x + self.fc2(self.fc1(self.ln(x)))


class Net(nn.Cell):
    def __init__(self, layers=4, d=16, vocab=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.transformer = nn.CellList([Block(d) for _ in range(layers)])
        self.head = nn.Dense(d, vocab, has_bias=False)

    def construct(self, x):
        h = self.embed(x)
        for block in self.transformer:
            h = block(h)
        return self.head(h)


class Small(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.dense = nn.Dense(8, 6)
        self.norm = nn.LayerNorm((6,))
        self.half = nn.Dense(6, 4).to_float(ms.float16)
        self.half.weight.set_dtype(ms.float16)

    def construct(self, x):
        return self.half(self.norm(self.dense(self.embed(x))))


def config(*modules, **extra):
    pc = dict(MESH3, optimizer={"sharding": True}, module_level=list(modules))
    pc.update(extra)
    return {"parallel_config": pc}


# -- Strategy input --------------------------------------------------------------------------

def test_strategy_table_rows():
    mesh = Layout((2, 2, 2), ("data", "tensor", "pipeline"))
    strategy = mesh(tensor_map=("tensor", None), optimizer_state="data")
    table = resolve_strategy(Small(), strategy)
    assert isinstance(table, StrategyTable)
    assert table.names() == ["embed.embedding_table", "dense.weight", "dense.bias", "norm.gamma", "norm.beta",
                             "half.weight", "half.bias"]
    emb = table["embed.embedding_table"]
    assert emb.global_shape == (10, 8) and emb.local_shape == (5, 8) and emb.dtype == "Float32"
    assert emb.tensor_map == ("tensor", None) and emb.param_bytes == 5 * 8 * 4
    assert emb.source == "default" and emb.devices == tuple(range(8))
    dense_w = table["dense.weight"]  # (6, 8): 6 splits by tensor, optimizer adds data on dim 1
    assert dense_w.local_shape == (3, 8)
    assert dense_w.optimizer_layout.tensor_map == ("tensor", "data")
    assert dense_w.optimizer_bytes == 2 * (3 * 4) * 4  # Adam: m and v, each (3, 4) float32
    half = table["half.weight"]  # (4, 6) float16
    assert half.dtype == "Float16" and half.param_bytes == 2 * 6 * 2


def test_optimizer_layout_dimension_choice():
    mesh = Layout((2, 2, 2), ("data", "tensor", "pipeline"))
    table = resolve_strategy(Small(), mesh(tensor_map=("tensor", None), optimizer_state="data"))
    # embedding (10, 8): 10 rows over tensor x data = 4 does not divide; dim 1 (8) takes data instead
    emb = table["embed.embedding_table"]
    assert emb.optimizer_layout.local_shape((10, 8)) == (5, 4)
    assert emb.optimizer_bytes == 2 * 5 * 4 * 4


def test_indivisible_default_is_noted_not_wrong():
    mesh = Layout((4,), ("tensor",))
    table = resolve_strategy(Small(), mesh(tensor_map=("tensor",)))
    bias = table["dense.bias"]  # (6,) not divisible by 4
    assert bias.tensor_map == (None,) and bias.local_shape == (6,)
    assert any("not divisible by 4" in n for n in bias.notes)
    assert "notes (*):" in str(table) and "dense.bias:" in str(table)


def test_table_interfaces():
    mesh = Layout((2,), ("data",))
    table = resolve_strategy(Small(), mesh(tensor_map=(), optimizer_state="data"))
    assert len(table) == 7 and "norm.gamma" in table and "nope" not in table
    assert [r.name for r in table] == table.names()
    with pytest.raises(KeyError, match="no parameter named 'nope'"):
        table["nope"]
    d = table.to_dict()
    assert set(d["parameters"]) == set(table.names())
    assert d["parameters"]["dense.weight"]["ms_tensor_map"] == [-1, -1]
    assert d["optimizer_axis"] == "data" and d["mesh"]["device_matrix"] == (2,)
    text = str(table)
    assert text.splitlines()[1].split()[:4] == ["parameter", "global", "local", "dtype"]
    assert "dense.weight" in text and "(6,8)" in text and "max per device" in text
    per = table.bytes_per_device()
    total = sum(r.param_bytes for r in table)
    assert per[0]["param"] == per[1]["param"] == total
    assert table.max_bytes_per_device() == per[0]["param"] + per[0]["optimizer"]


def test_optimizer_states_factor():
    mesh = Layout((2,), ("data",))
    table = resolve_strategy(Small(), mesh(tensor_map=()), optimizer_states=1)
    assert table["dense.weight"].optimizer_bytes == 6 * 8 * 4
    assert resolve_strategy(Small(), mesh(tensor_map=()), optimizer_states=0)["dense.weight"].optimizer_bytes == 0
    with pytest.raises(ValueError, match="optimizer_states"):
        resolve_strategy(Small(), mesh(tensor_map=()), optimizer_states=-1)


def test_strategy_override_divisibility_error():
    mesh = Layout((4,), ("tensor",))
    strategy = mesh(tensor_map=()).override("dense.*", "tensor")
    with pytest.raises(ValueError, match=r"override 'dense\.\*' for parameter 'dense\.weight'.*not divisible"):
        resolve_strategy(Small(), strategy)


def test_strategy_override_longer_than_rank():
    mesh = Layout((2,), ("tensor",))
    strategy = mesh(tensor_map=()).override("dense.bias", None, "tensor")
    with pytest.raises(ValueError, match=r"'dense\.bias'.*2 entries.*1 dimensions"):
        resolve_strategy(Small(), strategy)


def test_strategy_unknown_explicit_parameter():
    mesh = Layout((2,), ("tensor",))
    strategy = mesh(tensor_map=()).override("dense.wieght", "tensor")
    with pytest.raises(ValueError, match=r"override 'dense\.wieght' names no parameter"):
        resolve_strategy(Small(), strategy)


def test_strategy_pattern_matching_nothing_is_an_error_naming_the_nearest():
    mesh = Layout((2,), ("tensor",))
    strategy = mesh(tensor_map=()).override("*.dense_1.*", "tensor")  # the model's Cell is "dense"
    with pytest.raises(ValueError, match=r"override pattern '\*\.dense_1\.\*' matches no parameter of the model; "
                                         r"nearest parameter names: dense\.\w+, dense\.\w+, .*optional=True"):
        resolve_strategy(Small(), strategy)


def test_strategy_pattern_meant_for_other_models_opts_out():
    mesh = Layout((2,), ("tensor",))
    strategy = mesh(tensor_map=()).override("decoder.*", "tensor", optional=True).override("dense.*", "tensor")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = resolve_strategy(Small(), strategy)
    assert table["dense.weight"].tensor_map == ("tensor", None)
    strategy.override("decoder.*", "tensor")  # re-added without the flag: required again
    with pytest.raises(ValueError, match="'decoder.*' matches no parameter"):
        resolve_strategy(Small(), strategy)
    with pytest.raises(ValueError, match="optional='yes'; expected True or False"):
        strategy.override("x.*", "tensor", optional="yes")


def test_nearest_names_fold_layer_indices():
    names = ["layers.0.dense1.weight", "layers.1.dense1.weight", "layers.0.dense2.weight", "head.weight"]
    text = nearest_names("*.dense_1.*", names, "parameter")
    assert text.startswith("nearest parameter names: layers.*.dense1.weight")
    assert text.count("layers.*.dense1.weight") == 1 and "layers.0" not in text
    assert nearest_names("x", [], "Cell") == "the model has no Cells"


def test_bad_input_type():
    with pytest.raises(TypeError, match="expected a Strategy"):
        resolve_strategy(Small(), 42)


# -- config input ----------------------------------------------------------------------------

def test_config_module_strategy_and_pipeline_stages():
    cfg = config({"name": "transformer.*", "strategy": {"tensor": "(2,1)", "pipeline": 2}})
    table = resolve_strategy(Net(layers=4), cfg)
    assert table.pipeline_stages == 2
    w = table["transformer.0.fc1.weight"]
    assert w.tensor_map == ("tensor", None) and w.local_shape == (32, 16)
    assert w.source == "parallel_config.module_level[0]"
    assert table["transformer.0.fc1.bias"].tensor_map == ("tensor",)  # the trailing 1 needs no dimension
    assert table["embed.embedding_table"].source == "default"
    stages = {name: table[f"transformer.{i}.fc1.weight"].stage for i, name in enumerate("abcd")}
    assert list(stages.values()) == [0, 0, 1, 1]
    assert table["embed.embedding_table"].stage == 0  # before the first pipelined Cell
    assert table["head.weight"].stage == 1  # after the last one
    assert table.cell_stages == {"embed": 0, "transformer.0": 0, "transformer.1": 0, "transformer.2": 1,
                                 "transformer.3": 1, "head": 1}
    # stage s lives on the ranks whose pipeline coordinate is s
    assert table["transformer.3.fc2.weight"].devices == (1, 3, 5, 7)
    assert table["transformer.0.fc2.weight"].devices == (0, 2, 4, 6)
    per = table.bytes_per_device()
    assert per[0]["param"] == sum(r.param_bytes for r in table if r.stage == 0)


def test_pipeline_units_descend_when_too_few():
    class Wrapped(nn.Cell):
        def __init__(self):
            super().__init__()
            self.transformer = nn.SequentialCell([Block(8), Block(8)])

        def construct(self, x):
            return self.transformer(x)

    cfg = config({"name": "transformer", "strategy": {"pipeline": 2}})
    table = resolve_strategy(Wrapped(), cfg)
    assert table.cell_stages == {"transformer.0": 0, "transformer.1": 1}


def test_pipeline_more_stages_than_cells():
    cfg = {"parallel_config": {"device_matrix": [1, 8], "alias_names": ["data", "pipeline"],
                               "module_level": [{"name": "transformer.*", "strategy": {"pipeline": 8}}]}}
    with pytest.raises(ConfigError) as info:
        resolve_strategy(Net(layers=1), cfg)
    assert info.value.path == "parallel_config.module_level[0].strategy.pipeline"
    assert "8 pipeline stages" in str(info.value)


def test_partition_balances_contiguously():
    assert _partition([1, 1, 1, 1], 2) == [0, 0, 1, 1]
    assert _partition([10, 1, 1, 1], 2) == [0, 1, 1, 1]
    stages = _partition([1, 1, 1, 10], 3)
    assert stages[3] == 2 and stages[0] == 0 and sorted(stages) == stages and set(stages) == {0, 1, 2}
    assert _partition([5, 5, 5], 3) == [0, 1, 2]


def test_config_strategy_longer_than_parameter_rank():
    cfg = config({"name": "transformer.*", "strategy": {"tensor": "(1,2)"}})
    with pytest.raises(ConfigError) as info:
        resolve_strategy(Net(layers=1), cfg)
    assert info.value.path == "parallel_config.module_level[0].strategy.tensor"
    assert "transformer.0.ln.gamma" in str(info.value) and "1 dimensions" in str(info.value)


def test_config_indivisible_override_names_yaml_path():
    class Odd(nn.Cell):
        def __init__(self):
            super().__init__()
            self.proj = nn.Dense(4, 5)

        def construct(self, x):
            return self.proj(x)

    cfg = config({"name": "proj", "strategy": {"tensor": "(2,1)"}})
    with pytest.raises(ConfigError) as info:
        resolve_strategy(Odd(), cfg)
    assert info.value.path == "parallel_config.module_level[0].strategy.tensor"
    assert "proj.weight" in str(info.value) and "not divisible" in str(info.value)


def test_config_module_pattern_matching_nothing_is_an_error():
    cfg = config({"name": "decoder.*", "strategy": {"tensor": "(2,1)"}})
    with pytest.raises(ConfigError) as info:
        resolve_strategy(Small(), cfg)
    assert info.value.path == "parallel_config.module_level[0].name"
    message = str(info.value)
    assert "pattern 'decoder.*' matches no Cell of the model; nearest Cell names: " in message
    assert "dense" in message and "mark it `optional: true`" in message


def test_config_entries_marked_optional_may_match_nothing():
    cfg = config({"name": "decoder.*", "strategy": {"tensor": "(2,1)"}, "optional": True},
                 {"name": "dense", "strategy": {"tensor": "(2,1)"}},
                 parameter_level=[{"name": "lora_*", "tensor_map": ["tensor"], "optional": True}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = resolve_strategy(Small(), cfg)
    assert table["dense.weight"].tensor_map == ("tensor", None)
    with pytest.raises(ConfigError) as info:
        load_parallel_config(config({"name": "dense", "strategy": {"tensor": "(2,1)"}, "optional": "yes"}))
    assert info.value.path == "parallel_config.module_level[0].optional" and "expected true or false" in str(info.value)


def test_parameter_level_explicit_unknown_name():
    cfg = config(parameter_level=[{"name": "dense.wieght", "tensor_map": ["tensor"]}])
    with pytest.raises(ConfigError) as info:
        resolve_strategy(Small(), cfg)
    assert info.value.path == "parallel_config.parameter_level[0].name"
    assert "names no parameter" in str(info.value)


def test_parameter_level_pattern_matching_nothing_is_an_error():
    cfg = config(parameter_level=[{"name": "dec*.weight", "tensor_map": ["tensor"]}])
    with pytest.raises(ConfigError) as info:
        resolve_strategy(Small(), cfg)
    assert info.value.path == "parallel_config.parameter_level[0].name"
    assert "'dec*.weight' matches no parameter of the model; nearest parameter names: dense.weight" in str(info.value)


def test_parameter_level_longer_than_rank():
    cfg = config(parameter_level=[{"name": "dense.bias", "tensor_map": ["tensor", None]}])
    with pytest.raises(ConfigError) as info:
        resolve_strategy(Small(), cfg)
    assert info.value.path == "parallel_config.parameter_level[0].tensor_map"


def test_parameter_level_overrides_module_level():
    cfg = config({"name": "dense", "strategy": {"tensor": "(2,1)"}},
                 parameter_level=[{"name": "dense.weight", "tensor_map": [None, "tensor"]}])
    table = resolve_strategy(Small(), cfg)
    assert table["dense.weight"].tensor_map == (None, "tensor")
    assert table["dense.weight"].source == "parallel_config.parameter_level[0]"
    assert table["dense.bias"].tensor_map == ("tensor",)


def test_staged_parameter_cannot_use_pipeline_axis():
    cfg = config({"name": "transformer.*", "strategy": {"pipeline": 2}},
                 parameter_level=[{"name": "head.weight", "tensor_map": ["pipeline", None]}])
    with pytest.raises(ValueError, match="pipeline axis 'pipeline'"):
        resolve_strategy(Net(layers=2), cfg)


class MoENet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.transformer = nn.CellList([Block(16) for _ in range(4)])
        self.expert_layer = nn.Dense(16, 128)

    def construct(self, x):
        for block in self.transformer:
            x = block(x)
        return self.expert_layer(x)


def test_seed_parallel_config_resolves():
    table = resolve_strategy(MoENet(), CONFIGS / "parallel_config.yaml")
    assert table.mesh.device_matrix == (8, 2, 4) and table.pipeline_stages == 4
    w = table["transformer.1.fc1.weight"]
    assert w.tensor_map == ("tensor", None) and w.stage == 1 and len(w.devices) == 16
    expert = table["expert_layer.weight"]  # (128, 16) in the mpmd group on ranks 0-63
    assert expert.group == "expert_layer" and expert.stage is None and expert.devices == tuple(range(64))
    assert expert.tensor_map == (None, None) and expert.param_bytes == 128 * 16 * 4
    assert expert.optimizer_bytes == 2 * 128 * 16 * 4 // 64  # ZeRO-1 inside the group
    assert any("device group 'expert_layer'" in n for n in expert.notes)
    assert "group expert_layer" in str(table)


def test_seed_multimodal_groups_resolve():
    class Multimodal(nn.Cell):
        def __init__(self):
            super().__init__()
            self.text_encoder = nn.Dense(32, 32)
            self.vision_encoder = nn.Dense(64, 32)
            self.fusion_layer = nn.Dense(64, 8)

        def construct(self, t, v):
            return self.fusion_layer(ms.ops.concat((self.text_encoder(t), self.vision_encoder(v)), -1))

    table = resolve_strategy(Multimodal(), CONFIGS / "multimodal_process_groups.yaml")
    assert table["text_encoder.weight"].devices == tuple(range(128))
    assert table["vision_encoder.bias"].devices == tuple(range(128, 192))
    assert table["fusion_layer.weight"].group == "fusion_layer"
    per = table.bytes_per_device()
    assert per[192]["param"] == (64 * 8 + 8) * 4
    assert per[0]["param"] == (32 * 32 + 32) * 4


def test_process_group_pattern_matching_nothing_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolve_strategy(Small(), CONFIGS / "multimodal_process_groups.yaml")
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    for group in ("text_encoder", "vision_encoder", "fusion_layer"):
        assert any(m.startswith(f"process_groups.{group}: modules pattern '{group}' matches no Cell") for m in messages)


def test_tensor_parallel_example_config():
    class TP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(64, 16)
            self.layers = nn.CellList([Block(16), Block(16)])

        def construct(self, x):
            h = self.embed(x)
            for b in self.layers:
                h = b(h)
            return h

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = resolve_strategy(TP(), CONFIGS / "tensor_parallel_8.yaml")
    assert table["layers.0.fc1.weight"].local_shape == (16, 16)
    assert table["layers.1.fc2.weight"].local_shape == (16, 16)
    assert table["layers.1.fc2.bias"].tensor_map == (None,)
    assert table["embed.embedding_table"].local_shape == (16, 16)
    assert table["layers.0.ln.gamma"].tensor_map == (None,)


def test_rlhf_example_config():
    class RLHF(nn.Cell):
        def __init__(self):
            super().__init__()
            self.actor = nn.Dense(8, 8)
            self.critic = nn.Dense(8, 1)
            self.reward_model = nn.Dense(8, 1)

        def construct(self, x):
            return self.actor(x), self.critic(x), self.reward_model(x)

    table = resolve_strategy(RLHF(), load_parallel_config(CONFIGS / "rlhf_process_groups.yaml"))
    assert table["actor.weight"].devices == tuple(range(8))
    assert table["reward_model.weight"].group == "reward" and table["reward_model.weight"].devices == (12, 13, 14, 15)
    assert table["actor.weight"].optimizer_bytes == 2 * 64 * 4 // 8


def test_parameter_dtype_itemsize():
    class P(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(ms.Tensor(np.zeros((4, 4), np.float16)), name="w")

        def construct(self, x):
            return x

    table = resolve_strategy(P(), Layout((1,), ("data",))(tensor_map=()))
    assert table["w"].param_bytes == 32 and table["w"].dtype == "Float16"


def test_row_parallel_config_failing_on_the_bias_points_to_the_fix():
    """Issue 42: a natural row-parallel YAML fails on the 1-D bias; the error says what to add."""
    class Row(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Dense(16, 64), nn.Dense(64, 16)

        def construct(self, x):
            return self.fc2(self.fc1(x))

    pc = {"device_matrix": [2, 4], "alias_names": ["data", "tensor"],
          "module_level": [{"name": "fc1", "strategy": {"tensor": "(4,1)"}},
                           {"name": "fc2", "strategy": {"tensor": "(1,4)"}}]}
    with pytest.raises(ConfigError) as info:
        resolve_strategy(Row(), {"parallel_config": pc})
    assert info.value.path == "parallel_config.module_level[1].strategy.tensor"
    assert "parameter 'fc2.bias' of Cells matching 'fc2' has shape (16,)" in str(info.value)
    assert 'parameter_level: [{name: "fc2.bias", tensor_map: [None]}]' in str(info.value)
    pc["parameter_level"] = [{"name": "fc2.bias", "tensor_map": [None]}]  # the fix, as named
    table = resolve_strategy(Row(), {"parallel_config": pc})
    assert table["fc2.weight"].tensor_map == (None, "tensor") and table["fc2.bias"].tensor_map == (None,)
