"""Declaring context parallelism: Strategy keywords, layout(tensor_map=...), YAML, refusals."""
import pytest

from mindspore_hyper.shard import Layout
from mindspore_hyper.shard.context_parallel_spec import ContextParallel
from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.strategy.config import ConfigError, load_parallel_config

MESH = Layout((2, 2, 2), ("data", "tensor", "cp"))


def test_strategy_keywords_shard_the_sequence_dimension():
    s = Strategy(MESH, tensor_map=(), context_parallel="cp", context_method="ulysses")
    assert s.context == ContextParallel("cp", "ulysses") and s.sequence_dim == 1
    layout, notes = s.input_layout((4, 16, 8))
    assert layout.tensor_map == ("data", "cp", None) and notes == []
    assert "context_parallel='cp'" in repr(s) and "context_method='ulysses'" in repr(s)


def test_layout_keyword_form_defaults_to_ring():
    s = MESH(tensor_map=(), context_parallel="cp")
    assert isinstance(s, Strategy) and s.context == ContextParallel("cp", "ring")


def test_input_map_places_the_sequence_dimension():
    s = Strategy(MESH, input_map=("data", None, "cp"), context_parallel="cp")
    assert s.sequence_dim == 2
    assert s.input_layout((2, 3, 8))[0].tensor_map == ("data", None, "cp")


@pytest.mark.parametrize("kwargs, words", [
    (dict(context_parallel="seq"), ["'seq'", "not a mesh alias", "('data', 'tensor', 'cp')"]),
    (dict(context_parallel="cp", context_method="striped"), ["'striped'", "('ring', 'ulysses')"]),
    (dict(context_method="ring"), ["context_method='ring'", "without context_parallel"]),
    (dict(context_parallel="cp", tensor_map=("cp",)), ["'cp'", "cannot also split parameters"]),
    (dict(context_parallel="data"), ["'data'", "also data_axis"]),
    (dict(context_parallel="cp", input_map=("data",)), ["input_map=('data',)", "does not name the axis"]),
    (dict(context_parallel="cp", overrides={"fc.*": ("cp",)}), ["override 'fc.*'", "context-parallel axis 'cp'"]),
])
def test_bad_declarations_are_refused_by_name(kwargs, words):
    with pytest.raises(ValueError) as info:
        Strategy(MESH, **kwargs)
    for word in words:
        assert word in str(info.value)


def _yaml(context):
    return {"parallel_config": {"device_matrix": [2, 2, 2], "alias_names": ["data", "tensor", "cp"],
                                "context_parallel": context}}


def test_yaml_context_parallel_reaches_the_strategy():
    config = load_parallel_config(_yaml({"axis": "cp", "method": "ulysses"}))
    assert config.context_parallel == ContextParallel("cp", "ulysses")
    assert config.to_strategy().context == ContextParallel("cp", "ulysses")
    assert config.to_dict()["context_parallel"] == {"axis": "cp", "method": "ulysses"}
    assert load_parallel_config(_yaml({"axis": "cp"})).to_strategy().context.method == "ring"


@pytest.mark.parametrize("context, path, words", [
    ({"axis": "seq"}, "parallel_config.context_parallel.axis", ["'seq'"]),
    ({"axis": "cp", "method": "zigzag"}, "parallel_config.context_parallel.method", ["'zigzag'", "ring"]),
    ({"method": "ring"}, "parallel_config.context_parallel.axis", ["missing"]),
    ({"axis": "cp", "size": 2}, "parallel_config.context_parallel.size", ["unknown key"]),
    ("cp", "parallel_config.context_parallel", ["expected a mapping"]),
])
def test_yaml_bad_context_parallel_names_the_field(context, path, words):
    with pytest.raises(ConfigError) as info:
        load_parallel_config(_yaml(context))
    assert info.value.path == path
    for word in words:
        assert word in str(info.value)


def test_yaml_context_axis_used_by_parameters_is_refused():
    raw = _yaml({"axis": "cp"})
    raw["parallel_config"]["tensor_map"] = ["cp"]
    with pytest.raises(ConfigError) as info:
        load_parallel_config(raw).to_strategy()
    assert info.value.path == "parallel_config.context_parallel" and "cannot also split parameters" in str(info.value)
