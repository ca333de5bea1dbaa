"""Native translation: the Primitive.shard layouts and AutoParallel settings produced (never a run:
MindSpore refuses to compile semi-auto parallel on CPU)."""
import warnings
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, nn, ops
from mindspore.parallel import Layout as MsLayout
from mindspore.parallel.auto_parallel import AutoParallel

from mindspore_hyper import reset_context, set_context
from mindspore_hyper.parallelize import auto_parallelize
from mindspore_hyper.shard import Layout
from mindspore_hyper.runtime.native.translate import apply_native, native_mesh
from mindspore_hyper.strategy.resolve import resolve_strategy

from paths import CONFIGS  # noqa: E402


@pytest.fixture(autouse=True)
def _context():
    reset_context()
    yield
    reset_context()


def tmaps(prim):
    """The MindSpore tensor maps of a primitive's in_layout."""
    return [d["tensor_map"] for d in prim.attrs["in_layout"]]


class MatMulCell(nn.Cell):
    def __init__(self, transpose_b=False):
        super().__init__()
        shape = (8, 16) if transpose_b else (16, 8)
        self.w = Parameter(ms.Tensor(np.zeros(shape, np.float32)), name="w")
        self.matmul = ops.MatMul(transpose_b=transpose_b)

    def construct(self, x):
        return self.matmul(x, self.w)


class Net(nn.Cell):
    def __init__(self, one_hot=False):
        super().__init__()
        self.embed = nn.Embedding(32, 16, use_one_hot=one_hot)
        self.norm = nn.LayerNorm((16,))
        self.fc = nn.Dense(16, 64)
        self.proj = MatMulCell()

    def construct(self, x):
        return self.proj(ops.relu(self.fc(self.norm(self.embed(x)))[..., :16]))


MESH = Layout((2, 4), ("data", "tensor"))


def tp_strategy():
    return (MESH(tensor_map=(), optimizer_state="data")
            .override("fc.weight", "tensor", None).override("fc.bias", "tensor")
            .override("embed.embedding_table", "tensor", None).override("proj.w", "tensor", None))


def test_dense_layouts():
    net = Net()
    out = auto_parallelize(net, tp_strategy(), mode="native")
    # MindSpore counts mesh axes from the right: "data" -> 1, "tensor" -> 0.
    # MatMul(x, W^T): x = (data, W_in) = (1, -1); W = (tensor, None) = (0, -1)
    assert tmaps(net.fc.matmul) == [(1, -1), (0, -1)]
    # BiasAdd(y, b): y = (data, W_out) = (1, 0); b = (0,)
    assert tmaps(net.fc.bias_add) == [(1, 0), (0,)]
    assert net.fc.matmul.attrs["in_layout"][0]["device_matrix"] == (2, 4)
    assert net.fc.matmul.attrs["in_layout"][0]["alias_name"] == ("data", "tensor")
    plan = out.hyper_native_plan
    assert plan.primitive_layouts["fc.matmul"] == tuple(net.fc.matmul.attrs["in_layout"])
    assert plan.parameter_layouts["fc.weight"]["tensor_map"] == (0, -1)


def test_layouts_equal_mindspore_layout_objects():
    net = Net()
    auto_parallelize(net, tp_strategy(), mode="native")
    ms_mesh = MsLayout((2, 4), ("data", "tensor"))
    reference = ops.MatMul(transpose_b=True).shard((ms_mesh("data", "None"), ms_mesh("tensor", "None")))
    assert net.fc.matmul.attrs["in_layout"] == reference.attrs["in_layout"]


def test_layer_norm_layouts():
    net = Net()
    auto_parallelize(net, tp_strategy(), mode="native", activation_ndim=3)
    # x = (data, None, gamma's layout); gamma, beta replicated
    assert tmaps(net.norm.layer_norm) == [(1, -1, -1), (-1,), (-1,)]


def test_layer_norm_positive_begin_params_axis_sets_the_rank():
    class Norm(nn.Cell):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm((4, 8), begin_norm_axis=2, begin_params_axis=2)

        def construct(self, x):
            return self.norm(x)

    net = Norm()
    auto_parallelize(net, MESH(tensor_map=()), mode="native")
    assert tmaps(net.norm.layer_norm) == [(1, -1, -1, -1), (-1, -1), (-1, -1)]


def test_sharded_layer_norm_warns():
    net = Net()
    strategy = MESH(tensor_map=()).override("norm.*", "tensor")
    with pytest.warns(UserWarning, match="'norm' normalizes over dimensions split"):
        auto_parallelize(net, strategy, mode="native")
    assert tmaps(net.norm.layer_norm) == [(1, 0), (0,), (0,)]


def test_embedding_gather_layouts():
    net = Net()
    auto_parallelize(net, tp_strategy(), mode="native")
    # Gather(table, flat_ids): table (tensor, None); ids (data,)
    assert tmaps(net.embed.gather) == [(0, -1), (1,)]


def test_embedding_one_hot_layouts():
    net = Net(one_hot=True)
    auto_parallelize(net, tp_strategy(), mode="native")
    # MatMul(one_hot (N, vocab), table (vocab, emb)): (data, tensor), (tensor, None)
    assert tmaps(net.embed.array_mul) == [(1, 0), (0, -1)]
    assert "in_layout" not in net.embed.gather.attrs


def test_embedding_table_using_data_axis_leaves_batch_unsplit():
    net = Net()
    strategy = MESH(tensor_map=()).override("embed.embedding_table", "data", None)
    auto_parallelize(net, strategy, mode="native")
    assert tmaps(net.embed.gather) == [(1, -1), (-1,)]


@pytest.mark.parametrize("transpose_b, expected", [(False, [(1, 0), (0, -1)]), (True, [(1, -1), (0, -1)])])
def test_generic_matmul_cell(transpose_b, expected):
    class Wrap(nn.Cell):
        def __init__(self):
            super().__init__()
            self.proj = MatMulCell(transpose_b)

        def construct(self, x):
            return self.proj(x)

    net = Wrap()
    auto_parallelize(net, MESH(tensor_map=()).override("proj.w", "tensor", None), mode="native")
    assert tmaps(net.proj.matmul) == expected


def test_dense_bias_must_follow_weight():
    net = Net()
    strategy = MESH(tensor_map=()).override("fc.weight", "tensor", None)
    with pytest.raises(ValueError, match=r"nn.Dense 'fc': bias layout \(None,\)"):
        auto_parallelize(net, strategy, mode="native")


def test_unsupported_cell_with_sharded_parameter_warns():
    class Conv(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3)

        def construct(self, x):
            return self.conv(x)

    net = Conv()
    with pytest.warns(UserWarning, match=r"'conv' \(Conv2d\) has no native translation rule"):
        out = auto_parallelize(net, MESH(tensor_map=("tensor",)), mode="native")
    assert any("Conv2d" in s for s in out.hyper_native_plan.skipped)


def test_autoparallel_settings():
    net = Net()
    out = auto_parallelize(net, tp_strategy(), mode="native", activation_ndim=3)
    assert isinstance(out, AutoParallel) and out.network is net
    assert out._parallel_mode == "semi_auto"
    assert out._enable_parallel_optimizer and out._optimizer_weight_shard_size == 2
    assert out._parallel_optimizer_threshold == 0 and out._optimizer_level == "level1"
    assert out._pipeline_stages == 1
    (layout,) = out._dataset_strategy_config  # one input of rank 3: (data, None, None)
    assert layout.to_dict()["tensor_map"] == (1, -1, -1)
    assert out.hyper_native_plan.hsdp == {"shard_size": 2, "threshold": 0, "optimizer_level": "level1"}
    assert out.hyper_strategy_table["fc.weight"].local_shape == (16, 16)


def test_no_optimizer_sharding_and_full_batch():
    mesh = Layout((4,), ("tensor",))
    out = auto_parallelize(Net(), mesh(tensor_map=()), mode="native", input_ndims=(2,))
    assert not out._enable_parallel_optimizer
    assert out._dataset_strategy_config == "full_batch"


def test_input_ndims_and_input_map():
    strategy = Layout((2, 4), ("data", "seq"))(tensor_map=(), input_map=("data", "seq"))
    out = auto_parallelize(Net(), strategy, mode="native", input_ndims=(3, 1))
    maps = [lay.to_dict()["tensor_map"] for lay in out._dataset_strategy_config]
    assert maps == [(1, 0, -1), (1,)]


def test_pipeline_stages_from_config():
    class Deep(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32, 16)
            self.transformer = nn.CellList([nn.Dense(16, 16) for _ in range(4)])
            self.head = nn.Dense(16, 32, has_bias=False)

        def construct(self, x):
            h = self.embed(x)
            for layer in self.transformer:
                h = layer(h)
            return self.head(h)

    cfg = {"parallel_config": {"device_matrix": [2, 2, 2], "alias_names": ["data", "tensor", "pipeline"],
                               "optimizer": {"sharding": True},
                               "module_level": [{"name": "transformer.*",
                                                 "strategy": {"tensor": "(2,1)", "pipeline": 2}}]}}
    net = Deep()
    out = auto_parallelize(net, cfg, mode="native", pipeline_scheduler="gpipe")
    assert out._pipeline_stages == 2 and out._pipeline_scheduler == "gpipe"
    assert [net.transformer[i].pipeline_stage for i in range(4)] == [0, 0, 1, 1]
    assert net.embed.pipeline_stage == 0 and net.head.pipeline_stage == 1
    # A stage's devices: the strategies are written on the (data, tensor) matrix without the pipeline axis.
    assert native_mesh(out.hyper_strategy_table).device_matrix == (2, 2)
    assert net.transformer[0].matmul.attrs["in_layout"][1]["device_matrix"] == (2, 2)
    assert tmaps(net.transformer[0].matmul) == [(1, -1), (0, -1)]
    assert out.hyper_native_plan.cell_stages["head"] == 1


def test_seed_config_native_skips_mpmd_group_with_warning():
    class MoE(nn.Cell):
        def __init__(self):
            super().__init__()
            self.transformer = nn.CellList([nn.Dense(16, 16) for _ in range(4)])
            self.expert_layer = nn.Dense(16, 16)

        def construct(self, x):
            for layer in self.transformer:
                x = layer(x)
            return self.expert_layer(x)

    net = MoE()
    with pytest.warns(UserWarning, match="device groups not translated: expert_layer"):
        out = auto_parallelize(net, str(CONFIGS / "parallel_config.yaml"), mode="native")
    assert "in_layout" not in net.expert_layer.matmul.attrs
    assert tmaps(net.transformer[3].matmul) == [(1, -1), (0, -1)]
    assert out._pipeline_stages == 4 and out._optimizer_weight_shard_size == 8


def test_apply_native_directly_from_table():
    net = Net()
    table = resolve_strategy(net, tp_strategy())
    out = apply_native(net, table)
    assert out.hyper_strategy_table is table


def test_mode_from_context():
    set_context(mode="native")
    out = auto_parallelize(Net(), tp_strategy())
    assert isinstance(out, AutoParallel)


def test_distributed_mode_needs_one_process_per_device():
    with pytest.raises(ValueError, match=r"has 8 devices but the job has 1 processes; launch with msrun --worker_num=8"):
        auto_parallelize(Net(), tp_strategy(), mode="distributed")


def test_unknown_mode_and_keyword():
    with pytest.raises(ValueError, match="mode='ascend'"):
        auto_parallelize(Net(), tp_strategy(), mode="ascend")
    with pytest.raises(TypeError, match="unexpected keyword 'micro'"):
        auto_parallelize(Net(), tp_strategy(), mode="native", micro=2)
    with pytest.raises(TypeError, match="expected a Strategy"):
        auto_parallelize(Net(), 3, mode="native")


def test_simulation_mode_calls_the_simulation_runtime(monkeypatch):
    from mindspore_hyper.runtime import base

    calls = []

    class FakeSimulation:
        def parallelize(self, model, strategy, **kwargs):
            calls.append((model, strategy, kwargs))
            return "simulated"

    base._load_runtimes()
    monkeypatch.setitem(base.RUNTIMES, "simulation", FakeSimulation)
    net, strategy = Net(), tp_strategy()
    assert auto_parallelize(net, strategy, mode="simulation", device_memory="1GB") == "simulated"
    assert calls == [(net, strategy, {"device_memory": "1GB"})]
    set_context(mode="simulation")
    auto_parallelize(net, CONFIGS / "tensor_parallel_8.yaml")
    assert type(calls[-1][1]).__name__ == "ParallelConfig"  # YAML paths arrive loaded


def test_native_never_compiles_on_cpu_here():
    """Documented limitation: the attributes are all we check; MindSpore refuses CPU semi-auto parallel."""
    net = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = auto_parallelize(net, tp_strategy(), mode="native", activation_ndim=3)
    assert out.hyper_native_plan.skipped == []
    assert set(out.hyper_native_plan.primitive_layouts) == {"embed.gather", "norm.layer_norm", "fc.matmul",
                                                           "fc.bias_add", "proj.matmul"}


def test_optimizer_offload_is_reported_not_translated():
    cfg = {"parallel_config": {"device_matrix": [2, 4], "alias_names": ["data", "tensor"],
                               "optimizer": {"sharding": True, "offload": True}}}
    with pytest.warns(UserWarning, match="optimizer.offload is not translated"):
        out = auto_parallelize(Net(), cfg, mode="native")
    assert any(s.startswith("optimizer.offload") for s in out.hyper_native_plan.skipped)
    assert out._enable_parallel_optimizer
