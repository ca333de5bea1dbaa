"""Pipeline execution in simulation: every schedule kind trains like one device (losses and
parameters after 5 Adam steps), alone and with data x tensor stages; split backwards give the
full backward's gradients; stage-boundary bytes; YAML `pipeline: N`; bad inputs."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.pipeline import PipelineModel
from pipeline_models import assert_same_training, batch, dense_chain, single_device_run

KINDS = ["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe_v"]
MICROBATCHES = {"gpipe": 2, "1f1b": 2, "interleaved_1f1b": 2, "zb_h1": 2, "zb_v": 2, "dualpipe_v": 4}  # the least each takes


pytestmark = pytest.mark.usefixtures("pynative")


def pipelined(model, mesh, kind, m=4, **options):
    mh.set_context(mode="simulation", device_num=mesh.size)
    strategy = mesh(tensor_map=("tensor",) if "tensor" in mesh.alias_names else ())
    return mh.auto_parallelize(model, strategy, pipeline=dict(schedule=kind, microbatches=m, **options))


def train(parallel, x, y, steps=5, lr=1e-2):
    optimizer = nn.Adam(parallel.optimizer_parameters(), lr)
    return [float(parallel.train_step(optimizer, x, y).asnumpy()) for _ in range(steps)]


@pytest.fixture(scope="module")
def reference():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, y = batch()
    return single_device_run(dense_chain(), x, y)


@pytest.mark.parametrize("kind", KINDS)
def test_every_schedule_trains_like_one_device(kind, reference):
    model = dense_chain()
    x, y = batch()
    parallel = pipelined(model, Layout((2,), ("pipeline",)), kind, MICROBATCHES[kind])
    assert isinstance(parallel, PipelineModel)
    assert parallel.schedule.kind == kind
    assert_same_training(model, train(parallel, x, y), reference)


@pytest.mark.parametrize("kind", KINDS)
def test_every_schedule_with_data_and_tensor_stages(kind, reference):
    model = dense_chain()
    x, y = batch()
    parallel = pipelined(model, Layout((2, 2, 2), ("data", "tensor", "pipeline")), kind, MICROBATCHES[kind])
    losses = train(parallel, x, y)
    assert_same_training(model, losses, reference)
    report = parallel.report()
    assert len(report.memory) == 8
    assert any("@stage" in axis for axes in report.comm_backward.values() for axis in axes)


def test_split_backward_gives_the_full_backwards_gradients():
    x, y = batch()
    grads = {}
    for kind in ("1f1b", "zb_h1"):
        model = dense_chain()
        parallel = pipelined(model, Layout((2,), ("pipeline",)), kind)
        train(parallel, x, y, steps=1)
        grads[kind] = parallel.last_gradients
    kinds = [a.kind.value for a in parallel.schedule.actions[0]]
    assert "backward_input" in kinds and "backward_weight" in kinds and "backward" not in kinds
    assert grads["1f1b"].keys() == grads["zb_h1"].keys()
    for name, g in grads["1f1b"].items():
        np.testing.assert_allclose(grads["zb_h1"][name], g, rtol=1e-6, atol=1e-8, err_msg=name)
        assert np.abs(g).max() > 0, name


def test_transformer_encoder_layers_from_mindspore():
    def build():
        ms.set_seed(3)
        chain = nn.SequentialCell([nn.Dense(8, 16)] + [nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
                                                        for _ in range(2)] + [nn.Dense(16, 4)])
        return nn.WithLossCell(chain, nn.MSELoss())

    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((2, 3, 8)).astype(np.float32))
    y = Tensor(rng.standard_normal((2, 3, 4)).astype(np.float32))
    reference = single_device_run(build(), x, y, steps=2)
    model = build()
    parallel = pipelined(model, Layout((2,), ("pipeline",)), "zb_h1", 2)
    assert parallel.split == (2, 2)
    # the attention key bias has an exact gradient of 0 (softmax ignores a shift of all scores):
    # Adam turns its rounding noise into steps in both runs, so its bias is checked elementwise only
    loose = {f"{i}.self_attn.in_proj_bias" for i in (1, 2)}
    assert_same_training(model, train(parallel, x, y, steps=2), reference, loose=loose)


def test_report_counts_stage_boundary_bytes_and_has_the_timeline(tmp_path):
    model = dense_chain()
    x, y = batch()
    parallel = pipelined(model, Layout((2,), ("pipeline",)), "1f1b", layers_per_stage=(4, 3))
    train(parallel, x, y, steps=1)
    report = parallel.report()
    # the activation after layer 4 (a ReLU of width 16): 4 microbatches of 2 rows x 16 float32, back the same
    assert report.p2p == {"stage 0->1": {"activation_count": 4, "activation_bytes": 4 * 2 * 16 * 4,
                                         "gradient_count": 0, "gradient_bytes": 0},
                          "stage 1->0": {"activation_count": 0, "activation_bytes": 0,
                                         "gradient_count": 4, "gradient_bytes": 4 * 2 * 16 * 4}}
    assert report.timeline.makespan > 0 and 0 < report.timeline.bubble_fraction < 1
    assert "stage 0->1" in str(report)
    import json

    from mindspore_hyper.pipeline.side_by_side import write_side_by_side_trace

    path = tmp_path / "side.json"
    write_side_by_side_trace(str(path), [parallel.measured_timeline(), report.timeline])
    events = json.loads(path.read_text())["traceEvents"]
    computes = [e for e in events if e["ph"] == "X" and e["cat"] != "send" and e["cat"] != "recv"]
    assert {e["pid"] for e in computes} == {0, 1}
    assert sum(e["pid"] == 0 for e in computes) == sum(e["pid"] == 1 for e in computes) == 16  # 4 mb x (F+B) x 2
    params = {r: sum(p.asnumpy().nbytes for p in parallel.stage_cells[r].trainable_params()) for r in (0, 1)}
    assert {r: report.memory[r]["parameters"] for r in (0, 1)} == params


def test_yaml_pipeline_stages_run_the_schedule(reference, tmp_path):
    model = dense_chain()
    x, y = batch()
    config = {"parallel_config": {"device_matrix": [2], "alias_names": ["pipeline"],
                                  "module_level": [{"name": "_backbone.*", "strategy": {"pipeline": 2}}]}}
    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(model, config)
    assert isinstance(parallel, PipelineModel) and parallel.schedule.kind == "1f1b"
    assert parallel.schedule.num_microbatches == 2
    table_stages = {row.name: row.stage for row in parallel.table}
    for s, cell in parallel.stage_cells.items():
        for name, _ in cell.parameters_and_names():
            assert table_stages[name] == s
    assert_same_training(model, train(parallel, x, y), reference)


def test_a_config_pipeline_on_a_model_that_is_not_a_chain_warns():
    class Two(nn.Cell):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Dense(4, 4), nn.Dense(4, 4)

        def construct(self, x):
            return self.b(self.a(x)).sum()

    config = {"parallel_config": {"device_matrix": [2], "alias_names": ["pipeline"],
                                  "module_level": [{"name": "*", "strategy": {"pipeline": 2}}]}}
    mh.set_context(mode="simulation", device_num=2)
    with pytest.warns(UserWarning, match="not a chain of layers"):
        parallel = mh.auto_parallelize(Two(), config)
    assert not isinstance(parallel, PipelineModel)
    with pytest.raises(ValueError, match="pipeline: the model"):
        mh.auto_parallelize(Two(), Layout((2,), ("pipeline",))(tensor_map=()), pipeline={"schedule": "1f1b"})


@pytest.mark.parametrize("options, match", [
    ({"schedule": "1f1b", "microbatches": 3}, r"pipeline.microbatches=3 does not divide the batch size 8"),
    ({"schedule": "fancy"}, r"pipeline.schedule='fancy': unknown schedule kind"),
    ({"schedule": "1f1b", "microbatches": 1}, r"num_microbatches"),
    ({"schedule": "1f1b", "layers_per_stage": (3, 3)}, r"pipeline.layers_per_stage=\(3, 3\).*7 layers"),
    ({"schedule": "1f1b", "layers_per_stage": (7,)}, r"pipeline.layers_per_stage=\(7,\): 1 entries"),
    ({"schedule": "1f1b", "stages": 4}, r"pipeline.stages=4, but the mesh's 'pipeline' axis has size 2"),
    ({"schedule": "1f1b", "speed": 2}, r"pipeline: unknown key\(s\) \['speed'\]"),
])
def test_bad_pipeline_options_name_the_argument(options, match):
    model = dense_chain()
    x, y = batch()
    mh.set_context(mode="simulation", device_num=2)
    with pytest.raises(ValueError, match=match):
        parallel = mh.auto_parallelize(model, Layout((2,), ("pipeline",))(tensor_map=()), pipeline=options)
        train(parallel, x, y, steps=1)


def test_more_virtual_stages_than_layers_is_refused():
    model = nn.WithLossCell(nn.SequentialCell([nn.Dense(8, 4), nn.ReLU(), nn.Dense(4, 4)]), nn.MSELoss())
    mh.set_context(mode="simulation", device_num=2)
    with pytest.raises(ValueError, match="3 pipeline layers but the schedule needs 4 virtual stages"):
        mh.auto_parallelize(model, Layout((2,), ("pipeline",))(tensor_map=()), pipeline={"schedule": "zb_v"})


def test_mesh_and_strategy_errors():
    mh.set_context(mode="simulation", device_num=2)
    with pytest.raises(ValueError, match="pipeline.axis='pipeline': the strategy's mesh"):
        mh.auto_parallelize(dense_chain(), Layout((2,), ("data",))(tensor_map=()), pipeline={})
    with pytest.raises(ValueError, match="shards tensors along 'pipeline'"):
        mh.auto_parallelize(dense_chain(), Layout((2,), ("pipeline",))(tensor_map=("pipeline",)), pipeline={})


def test_a_default_map_naming_the_pipeline_axis_past_every_parameter_pipelines(reference):
    """The seed's form, tensor_map=("tensor", None, "pipeline"), names the pipeline axis at a third
    dimension no parameter of a Dense chain has: nothing is split along it, so the model pipelines
    (each stage's strategy without that axis) and trains like one device. A parameter that is split
    along it is refused, named."""
    model = dense_chain()
    x, y = batch()
    mesh = Layout((2, 2), ("tensor", "pipeline"))
    mh.set_context(mode="simulation", device_num=mesh.size)
    parallel = mh.auto_parallelize(model, mesh(tensor_map=("tensor", None, "pipeline")),
                                   pipeline=dict(schedule="1f1b", microbatches=2))
    assert_same_training(model, train(parallel, x, y), reference)
    with pytest.raises(ValueError, match=r"shards tensors along 'pipeline'.*\(split along it: _backbone\.2\.weight\)"):
        mh.auto_parallelize(dense_chain(), mesh(tensor_map=()).override("*.2.weight", None, "pipeline"), pipeline={})
