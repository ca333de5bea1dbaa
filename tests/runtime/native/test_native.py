"""Native translation: the Primitive.shard layouts and AutoParallel settings produced (never a run:
MindSpore refuses to compile semi-auto parallel on CPU)."""
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, nn, ops
from mindspore.parallel import Layout as MsLayout
from mindspore.parallel.auto_parallel import AutoParallel

from mindspore_hyper import set_context
from mindspore_hyper.parallelize import auto_parallelize
from mindspore_hyper.shard import Layout
from mindspore_hyper.runtime.native.translate import apply_native, native_mesh
from mindspore_hyper.strategy.resolve import resolve_strategy

from paths import CONFIGS  # noqa: E402



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
        h = ops.relu(self.fc(self.norm(self.embed(x)))[..., :16])
        return self.proj(h.reshape(-1, 16))


MESH = Layout((2, 4), ("data", "tensor"))


def tp_strategy():
    return (MESH(tensor_map=(), optimizer_state="data")
            .override("fc.weight", "tensor", None).override("fc.bias", "tensor")
            .override("embed.embedding_table", "tensor", None).override("proj.w", "tensor", None))


IDS = ms.Tensor(np.arange(16).reshape(8, 2) % 32, ms.int32)  # Net's input: (batch 8, 2 tokens)


def native(net, strategy, **kwargs):
    return auto_parallelize(net, strategy, mode="native", example_inputs=(IDS,), **kwargs)


def check_in_layouts(plan, mesh_size):
    """Every in_layout as MindSpore's semi-auto parallel checks it: one tensor-map entry per
    input dimension, each dimension divisible by the devices splitting it (MindSpore numbers
    mesh axes from the right), a device matrix holding the stage's devices, and a Layout that
    mindspore.parallel.Layout rebuilds identically."""
    assert plan.primitive_layouts
    for key, layouts in plan.primitive_layouts.items():
        shapes = plan.primitive_shapes[key]
        assert len(layouts) == len(shapes), key
        for shape, lay in zip(shapes, layouts):
            matrix, tmap = lay["device_matrix"], lay["tensor_map"]
            assert len(tmap) == len(shape), (key, shape, tmap)
            assert int(np.prod(matrix)) == mesh_size, (key, matrix)
            for size, entry in zip(shape, tmap):
                axes = entry if isinstance(entry, tuple) else (entry,)
                splits = int(np.prod([matrix[len(matrix) - 1 - a] for a in axes if a != -1]))
                assert size % splits == 0, (key, shape, tmap)
            names = lay["alias_name"]
            aliases = [tuple(names[len(names) - 1 - a] for a in e) if isinstance(e, tuple)
                       else "None" if e == -1 else names[len(names) - 1 - e] for e in tmap]
            rebuilt = MsLayout(matrix, names)(*aliases).to_dict()
            assert {k: rebuilt[k] for k in lay} == lay, key


def test_layouts_come_from_the_observed_calls():
    net = Net()
    out = native(net, tp_strategy())
    plan = out.hyper_native_plan
    # shapes as the model ran them: the embedding's flattened ids, Dense's 2-D input after its reshape
    assert plan.primitive_shapes["embed.gather"] == ((32, 16), (16,))
    assert plan.primitive_shapes["fc.matmul"] == ((16, 16), (64, 16))
    assert plan.primitive_shapes["norm.layer_norm"] == ((8, 2, 16), (16,), (16,))
    # MindSpore counts mesh axes from the right: "data" -> 1, "tensor" -> 0.
    assert tmaps(net.fc.matmul) == [(1, -1), (0, -1)]  # column parallel: x (data, None), W (tensor, None)
    assert tmaps(net.fc.bias_add) == [(1, 0), (0,)]
    assert tmaps(net.norm.layer_norm) == [(1, -1, -1), (-1,), (-1,)]  # rank 3 as observed
    assert plan.primitive_layouts["fc.matmul"] == tuple(net.fc.matmul.attrs["in_layout"])
    assert plan.parameter_layouts["fc.weight"]["tensor_map"] == (0, -1)
    check_in_layouts(plan, 8)


def test_layouts_equal_mindspore_layout_objects():
    net = Net()
    native(net, tp_strategy())
    ms_mesh = MsLayout((2, 4), ("data", "tensor"))
    reference = ops.MatMul(transpose_b=True).shard((ms_mesh("data", "None"), ms_mesh("tensor", "None")))
    assert net.fc.matmul.attrs["in_layout"] == reference.attrs["in_layout"]


def test_readme_gpt_is_a_training_step_with_valid_strategies_and_no_warnings():
    """The README's GPT and quickstart strategy: no warnings; every strategy valid; the step
    carries the loss (the model's own) and the optimizer, with hsdp for the optimizer axis."""
    import sys

    from paths import EXAMPLES
    sys.path.insert(0, str(EXAMPLES))
    from models import GPT

    model = GPT()
    layout = Layout(device_matrix=(2, 2, 2), alias_names=("data", "tensor", "pipeline"))
    strategy = layout(tensor_map=("tensor", None, "pipeline"), optimizer_state="data")
    ids = ms.Tensor(np.arange(8 * 16).reshape(8, 16) % 128, ms.int32)
    optimizer = nn.AdamWeightDecay(model.trainable_params(), 1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = auto_parallelize(model, strategy, mode="native", example_inputs=(ids, ids), optimizer=optimizer)
    plan = out.hyper_native_plan
    check_in_layouts(plan, 8)
    assert plan.primitive_shapes["blocks.0.ln1.layer_norm"][0] == (8, 16, 64)  # 3-D, as run
    assert len([k for k in plan.primitive_layouts if k.endswith(".matmul")]) == 9  # 4 Dense per block + head
    assert callable(out.network) and not isinstance(out.network, nn.Cell)  # train_one_step
    assert out.hyper_network is model and out.hyper_optimizer is optimizer
    assert out._enable_parallel_optimizer and out._optimizer_weight_shard_size == 2
    assert [lay.to_dict()["tensor_map"] for lay in out._dataset_strategy_config] == [(2, -1), (2, -1)]
    assert plan.skipped == [] and "MatMulExt" in plan.left_to_mindspore


def test_loss_fn_wraps_the_model_and_labels_are_inputs():
    net = Net()
    labels = ms.Tensor(np.zeros((16, 8), np.float32))
    optimizer = nn.SGD(net.trainable_params(), 1e-2)
    out = auto_parallelize(net, tp_strategy(), mode="native", example_inputs=(IDS, labels), loss_fn=nn.MSELoss(),
                           optimizer=optimizer)
    assert isinstance(out.hyper_network, nn.WithLossCell)
    assert "fc.matmul" in out.hyper_native_plan.primitive_layouts
    assert len(out._dataset_strategy_config) == 2


def test_autoparallel_settings_without_optimizer():
    net = Net()
    out = native(net, tp_strategy())
    assert isinstance(out, AutoParallel) and out.network is net
    assert out._parallel_mode == "semi_auto"
    assert not out._enable_parallel_optimizer  # no optimizer: no training step, no hsdp
    assert any("no optimizer" in s for s in out.hyper_native_plan.skipped)
    assert out._pipeline_stages == 1
    (layout,) = out._dataset_strategy_config  # the input's observed rank 2: (data, None)
    assert layout.to_dict()["tensor_map"] == (1, -1)
    out = native(Net(), tp_strategy(), optimizer=nn.SGD(net.trainable_params(), 1e-2))
    assert out._enable_parallel_optimizer and out._optimizer_weight_shard_size == 2
    assert out._parallel_optimizer_threshold == 0 and out._optimizer_level == "level1"
    assert out.hyper_native_plan.hsdp == {"shard_size": 2, "threshold": 0, "optimizer_level": "level1"}


def test_no_optimizer_sharding_and_full_batch():
    mesh = Layout((4,), ("tensor",))
    out = native(Net(), mesh(tensor_map=()))
    assert not out._enable_parallel_optimizer
    assert out._dataset_strategy_config == "full_batch"


def test_example_inputs_are_required():
    with pytest.raises(ValueError, match="example_inputs"):
        auto_parallelize(Net(), tp_strategy(), mode="native")


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


STAGED = {"parallel_config": {"device_matrix": [2, 2, 2], "alias_names": ["data", "tensor", "pipeline"],
                              "optimizer": {"sharding": True},
                              "module_level": [{"name": "transformer.*",
                                                "strategy": {"tensor": "(2,1)", "pipeline": 2}}]}}


def test_pipeline_stages_micro_batches_and_grad_reducer():
    from mindspore.parallel.nn import Pipeline

    net = Deep()
    optimizer = nn.SGD(net.trainable_params(), 1e-2)
    out = native(net, STAGED, optimizer=optimizer, micro_batches=4, loss_fn=None, pipeline_scheduler="gpipe")
    assert out._pipeline_stages == 2 and out._pipeline_scheduler == "gpipe"
    assert isinstance(out.hyper_network, Pipeline) and out.hyper_native_plan.micro_batches == 4
    assert [net.transformer[i].pipeline_stage for i in range(4)] == [0, 0, 1, 1]
    assert net.embed.pipeline_stage == 0 and net.head.pipeline_stage == 1
    # A stage's devices: the strategies are written on the (data, tensor) matrix without the pipeline axis.
    assert native_mesh(out.hyper_strategy_table).device_matrix == (2, 2)
    assert net.transformer[0].matmul.attrs["in_layout"][1]["device_matrix"] == (2, 2)
    assert tmaps(net.transformer[0].matmul) == [(1, -1), (0, -1)]
    check_in_layouts(out.hyper_native_plan, 4)


def test_micro_batches_checked():
    with pytest.raises(ValueError, match=r"micro_batches=1: expected an int >= the 2 pipeline stages"):
        native(Deep(), STAGED, micro_batches=1)
    with pytest.raises(ValueError, match="no pipeline stages"):
        native(Net(), tp_strategy(), micro_batches=4)


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
    x = ms.Tensor(np.ones((64, 16), np.float32))
    with pytest.warns(UserWarning, match="device groups not translated: expert_layer"):
        out = auto_parallelize(net, str(CONFIGS / "parallel_config.yaml"), mode="native", example_inputs=(x,),
                               optimizer=nn.SGD(net.trainable_params(), 1e-2))
    assert "in_layout" not in net.expert_layer.matmul.attrs
    assert tmaps(net.transformer[0].matmul) == [(1, -1), (0, -1)]
    assert out._pipeline_stages == 4 and out._optimizer_weight_shard_size == 8
    check_in_layouts(out.hyper_native_plan, 16)


def test_check_in_strategy_refuses_what_mindspore_would():
    from mindspore_hyper.runtime.native.checks import check_in_strategy
    from mindspore_hyper.shard.tensor_layout import TensorLayout

    good = [TensorLayout(MESH, ("data", None)), TensorLayout(MESH, ("tensor", None))]
    check_in_strategy("fc.matmul", [(16, 16), (64, 16)], good, MESH)
    with pytest.raises(ValueError, match="fc.matmul: input 0 has rank 3"):
        check_in_strategy("fc.matmul", [(2, 8, 16), (64, 16)], good, MESH)
    with pytest.raises(ValueError, match="input 1 dimension 0 of size 6 does not divide by the 4 devices"):
        check_in_strategy("fc.matmul", [(16, 16), (6, 16)], good, MESH)
    with pytest.raises(ValueError, match="2 layouts for 1 tensor inputs"):
        check_in_strategy("fc.matmul", [(16, 16)], good, MESH)


def test_apply_native_directly_from_table():
    net = Net()
    table = resolve_strategy(net, tp_strategy())
    out = apply_native(net, table, example_inputs=(IDS,))
    assert out.hyper_strategy_table is table


def test_mode_from_context():
    set_context(mode="native")
    out = auto_parallelize(Net(), tp_strategy(), example_inputs=(IDS,))
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


def test_simulation_mode_calls_the_simulation_runtime(monkeypatch, tmp_path):
    import mindspore_hyper.parallelize as entry

    calls = []

    class FakeSimulation:
        name = "simulation"

        def runs_op_by_op(self):  # the Runtime protocol's questions auto_parallelize asks
            return True

        def computes_values(self):
            return True

        def parallelize(self, model, table, return_dtensor=False):
            calls.append((model, table, return_dtensor))
            return "simulated"

    monkeypatch.setitem(entry.RUNTIMES, "simulation", FakeSimulation)
    net, strategy = Net(), tp_strategy()
    assert auto_parallelize(net, strategy, mode="simulation", return_dtensor=True) == "simulated"
    model, table, return_dtensor = calls[-1]
    assert model is net and table.strategy is strategy and return_dtensor is True
    set_context(mode="simulation")
    with pytest.raises(ValueError, match="matches no (Cell|parameter) of the model"):  # the config names another model
        auto_parallelize(net, CONFIGS / "tensor_parallel_8.yaml")
    path = tmp_path / "net.yaml"
    path.write_text("parallel_config:\n  device_matrix: [2, 4]\n  alias_names: [data, tensor]\n"
                    "  module_level:\n    - {name: fc, strategy: {tensor: \"(4,1)\"}}\n")
    auto_parallelize(net, path)
    assert type(calls[-1][1].config).__name__ == "ParallelConfig"  # YAML paths arrive loaded


def test_native_never_compiles_on_cpu_here():
    """Documented limitation: the attributes are all we check; MindSpore refuses CPU semi-auto parallel."""
    net = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = native(net, tp_strategy(), optimizer=nn.SGD(net.trainable_params(), 1e-2))
    assert out.hyper_native_plan.skipped == []
    assert set(out.hyper_native_plan.primitive_layouts) == {"embed.gather", "norm.layer_norm", "fc.matmul",
                                                           "fc.bias_add", "proj.matmul"}


def test_the_step_refuses_to_run_on_cpu():
    """Issue 42: on CPU the step ran the whole model on one device without a word (MindSpore skips
    every shard() in one PyNative process); its call is refused, naming what runs the strategy here,
    before anything is computed, and the translation stays readable."""
    net = Net()
    step = native(net, tp_strategy(), optimizer=nn.SGD(net.trainable_params(), 1e-2))
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    with pytest.raises(RuntimeError, match=r"native mode does not run on CPU.*not on the strategy's 8\. On CPU use "
                                           r"mh\.set_context\(mode='simulation', device_num=8\).*mode='distributed' "
                                           r"under msrun.*--worker_num=8"):
        step(IDS)
    for old, p in zip(before, net.trainable_params()):
        np.testing.assert_array_equal(p.asnumpy(), old)  # no update ran
    assert isinstance(step, AutoParallel) and step.hyper_native_plan.primitive_layouts


def test_the_step_refuses_fewer_processes_than_devices_on_ascend(monkeypatch):
    """Issue 42: on Ascend/GPU a job with fewer processes than the strategy's devices was not
    refused. Not run on Ascend (none here): the device target the runtime reads is set to Ascend.
    The call is refused before anything is computed, naming both counts and the fix; the check
    passes with one process per device."""
    from mindspore_hyper.runtime.native import run_refusals

    monkeypatch.setattr(run_refusals, "device_target", lambda: "Ascend")
    monkeypatch.delenv("RANK_SIZE", raising=False)
    monkeypatch.setenv("MS_WORKER_NUM", "4")
    net = Net()
    step = native(net, tp_strategy(), optimizer=nn.SGD(net.trainable_params(), 1e-2))
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    with pytest.raises(RuntimeError, match=r"native mode on Ascend: the strategy's mesh has 8 devices but this job "
                                           r"has 4 process\(es\).*msrun --worker_num=8 .*mh\.set_context\("
                                           r"mode='simulation', device_num=8\)"):
        step(IDS)
    for old, p in zip(before, net.trainable_params()):
        np.testing.assert_array_equal(p.asnumpy(), old)  # no update ran
    monkeypatch.delenv("MS_WORKER_NUM")
    with pytest.raises(RuntimeError, match=r"has 1 process\(es\)"):  # outside a job: one process
        run_refusals.check_can_run(8)
    monkeypatch.setenv("RANK_SIZE", "8")  # a rank-table launch
    assert run_refusals.check_can_run(8) is None
    monkeypatch.setenv("MS_WORKER_NUM", "8")
    assert run_refusals.check_can_run(8) is None


@pytest.mark.parametrize("option,value", [("max_grad_norm", 1.0), ("accumulation_steps", 4), ("loss_scale", 1024.0)])
@pytest.mark.parametrize("target", ["CPU", "Ascend"])
def test_training_options_are_refused_naming_the_option(monkeypatch, option, value, target):
    """Issue 41: the native step (MindSpore's value_and_grad and update, translate.py) has no
    clipping, accumulation or loss scaling; passed to its call or to a ParallelModel-style
    train_step, each option is refused naming it, before any other check (on CPU and, with the
    device target the runtime reads set to Ascend and one process per device, where the step
    would otherwise run), and nothing is updated."""
    from mindspore_hyper.runtime.native import run_refusals

    monkeypatch.setattr(run_refusals, "device_target", lambda: target)
    monkeypatch.setenv("MS_WORKER_NUM", "8")
    net = Net()
    opt = nn.SGD(net.trainable_params(), 1e-2)
    step = native(net, tp_strategy(), optimizer=opt)
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    message = rf"native mode: {option}={value!r} is not translated: .*mode='simulation' and mode='distributed'"
    with pytest.raises(ValueError, match=message):
        step(IDS, **{option: value})
    with pytest.raises(ValueError, match=message):
        step.train_step(opt, IDS, **{option: value})
    with pytest.raises(TypeError, match=r"called as step\(\*batch\).*no train_step\(optimizer, \*inputs\)"):
        step.train_step(opt, IDS)
    for old, p in zip(before, net.trainable_params()):
        np.testing.assert_array_equal(p.asnumpy(), old)  # no update ran


def test_optimizer_offload_is_reported_not_translated():
    cfg = {"parallel_config": {"device_matrix": [2, 4], "alias_names": ["data", "tensor"],
                               "optimizer": {"sharding": True, "offload": True}}}
    with pytest.warns(UserWarning, match="optimizer.offload is not translated"):
        out = native(Net(), cfg, optimizer=nn.SGD(Net().trainable_params(), 1e-2))
    assert any(s.startswith("optimizer.offload") for s in out.hyper_native_plan.skipped)
    assert out._enable_parallel_optimizer


def test_moe_example_config_gives_valid_strategies():
    """The MoE example's model and strategy (data x expert x tensor): every primitive strategy
    passes MindSpore's checks; the shared expert's Dense layers are tensor parallel; the
    experts' batched functional matmuls have no primitive and are left to MindSpore."""
    import sys

    from paths import EXAMPLES
    sys.path.insert(0, str(EXAMPLES))
    from moe_training import MoEClassifier, strategy

    set_context(device_num=8)
    model = MoEClassifier()
    ids = ms.Tensor(np.arange(8 * 16).reshape(8, 16) % 64, ms.int32)
    optimizer = nn.AdamWeightDecay(model.trainable_params(), 1e-3)
    out = auto_parallelize(model, strategy(8), mode="native", example_inputs=(ids, ids), optimizer=optimizer)
    plan = out.hyper_native_plan
    check_in_layouts(plan, 8)
    assert {"moe.shared.gate.matmul", "moe.shared.up.matmul", "moe.shared.down.matmul",
            "head.matmul"} <= set(plan.primitive_layouts)
    weight_map = plan.primitive_layouts["moe.shared.gate.matmul"][1]["tensor_map"]
    assert weight_map == (0, -1)  # the gate's output features over "tensor" (axis 0 from the right)
    assert plan.skipped == []
