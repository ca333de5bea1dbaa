"""Strategy: the seed's keyword form, default-map fitting, overrides, optimizer-state sharding."""
import pytest

from mindspore_hyper.shard import Layout
from mindspore_hyper.shard.model_strategy import Strategy

MESH = Layout(device_matrix=(2, 2, 2), alias_names=("data", "tensor", "pipeline"))


def test_seed_keyword_form_returns_strategy():
    strategy = MESH(tensor_map=("tensor", None, "pipeline"), optimizer_state="data")
    assert isinstance(strategy, Strategy) and strategy.mesh is MESH
    assert not hasattr(Layout, "strategy_builder")  # built by the algebra itself, no hook installed from above
    assert strategy.data_axis == "data" and strategy.optimizer_state == "data"


def test_default_map_applied_by_position_and_truncated():
    s = MESH(tensor_map=("tensor", None, "pipeline"), optimizer_state="data")
    w = s.param_placement("fc.weight", (64, 32))
    assert w.layout.tensor_map == ("tensor", None) and w.local_shape == (32, 32) and w.source == "default"
    b = s.param_placement("fc.bias", (64,))
    assert b.layout.tensor_map == ("tensor",)
    k = s.param_placement("conv.weight", (8, 4, 6, 3))
    assert k.layout.tensor_map == ("tensor", None, "pipeline", None)


def test_indivisible_default_dimension_left_unsharded_and_reported():
    s = MESH(tensor_map=("tensor", None, "pipeline"))
    p = s.param_placement("odd", (3, 4, 5))
    assert p.layout.tensor_map == (None, None, None)
    assert len(p.notes) == 2 and "dimension 0 (size 3) not divisible by 2" in p.notes[0]


def test_overrides_last_match_wins_and_are_strict():
    s = MESH(tensor_map=("tensor",), overrides={"*.weight": (None, "tensor")})
    s.override("head.*", ("tensor", "pipeline"), None)
    assert s.param_placement("fc.weight", (8, 8)).layout.tensor_map == (None, "tensor")
    head = s.param_placement("head.weight", (8, 8))
    assert head.layout.tensor_map == (("tensor", "pipeline"), None) and head.source == "head.*"
    with pytest.raises(ValueError, match=r"override 'head\.\*' for parameter 'head.bias'.*2 entries"):
        s.param_placement("head.bias", (8,))
    with pytest.raises(ValueError, match="override '\\*.weight' for parameter 'x.weight'.*not divisible"):
        s.param_placement("x.weight", (8, 3))


def test_optimizer_state_sharded_along_axis_zero1():
    s = MESH(tensor_map=("tensor", None), optimizer_state="data")
    p = s.param_placement("w", (8, 6))
    assert p.optimizer_layout.tensor_map == (("tensor", "data"), None)
    assert p.optimizer_layout.local_shape((8, 6)) == (2, 6)
    # first dim cannot take the extra split -> the next dimension that divides
    q = s.param_placement("v", (2, 6))
    assert q.optimizer_layout.tensor_map == ("tensor", "data")
    # nothing divides -> states stay like the parameter
    r = s.param_placement("u", (2, 3))
    assert r.optimizer_layout == r.layout


def test_input_layout_data_and_sequence():
    s = MESH(tensor_map=())
    layout, notes = s.input_layout((8, 16, 32))
    assert layout.tensor_map == ("data", None, None) and not notes
    seq = MESH(tensor_map=(), input_map=("data", "pipeline"))
    assert seq.input_layout((8, 16))[0].tensor_map == ("data", "pipeline")
    no_data = Layout((4,), ("mp",))(tensor_map=("mp",))
    assert no_data.data_axis is None and no_data.input_layout((4, 4))[0].tensor_map == (None, None)


@pytest.mark.parametrize("kwargs,match", [
    (dict(tensor_map=("model",)), "'model'"),
    (dict(tensor_map=(), optimizer_state="zero"), "unknown mesh axis 'zero'"),
    (dict(tensor_map=(), data_axis="batch"), "unknown mesh axis 'batch'"),
    (dict(tensor_map=(), overrides={"": ("data",)}), "non-empty name pattern"),
    (dict(tensor_map=(), overrides={"a.*": ("data", "data")}), "override 'a.\\*'.*more than once"),
])
def test_strategy_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MESH(**kwargs)


def test_keyword_without_tensor_map_is_an_error():
    with pytest.raises(ValueError, match="without tensor_map"):
        MESH(optimizer_state="data")
