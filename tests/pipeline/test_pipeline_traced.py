"""Pipelines of models whose construct loops over an nn.CellList of blocks with side inputs
(examples/models.py GPT; MindSpore's TransformerEncoderLayer with a padding mask computed from
the input ids): 5 Adam steps equal single-device training for 1f1b, zb_h1 and interleaved 1F1B;
a tied embedding / head weight; models that cannot be cut are refused naming the call."""
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.runtime.distributed.runtime import DistributedRuntime
from mindspore_hyper.pipeline import PipelineModel
from mindspore_hyper.runtime.simulation.simulated_model import SimulatedModel
from pipeline_models import assert_same_training, gpt, single_device_run, tokens

PIPELINE_2 = Layout((2,), ("pipeline",))


pytestmark = pytest.mark.usefixtures("pynative")


def pipelined(model, kind, m=4, mesh=PIPELINE_2, **options):
    mh.set_context(mode="simulation", device_num=mesh.size)
    return mh.auto_parallelize(model, mesh(tensor_map=()), pipeline=dict(schedule=kind, microbatches=m, **options))


def train(parallel, inputs, steps=5, lr=1e-2):
    optimizer = nn.Adam(parallel.optimizer_parameters(), lr)
    return [float(parallel.train_step(optimizer, *inputs).asnumpy()) for _ in range(steps)]


@pytest.fixture(scope="module")
def gpt_reference():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    return single_device_run(gpt(), *tokens(), lr=1e-3)


@pytest.mark.parametrize("kind", ["1f1b", "zb_h1", "interleaved_1f1b"])
def test_gpt_with_mask_side_input_trains_like_one_device(kind, gpt_reference):
    model = gpt()
    parallel = pipelined(model, kind, m=2)
    assert isinstance(parallel, PipelineModel)
    losses = train(parallel, tokens(), lr=1e-3)
    assert parallel.split == ((2, 2) if kind != "interleaved_1f1b" else (1, 1, 1, 1))
    first, last = parallel.stage_cells[0], parallel.stage_cells[len(parallel.split) - 1]
    assert {"embed.embedding_table", "pos.embedding_table"} <= {n for n, _ in first.parameters_and_names()}
    assert {"ln_f.gamma", "head.weight"} <= {n for n, _ in last.parameters_and_names()}
    # the attention key bias has an exact gradient of 0 (softmax ignores a shift of all scores):
    # Adam turns its rounding noise into steps in both runs, so it is checked elementwise only
    loose = {f"blocks.{i}.attn.qkv.bias" for i in range(4)}
    assert_same_training(model, losses, gpt_reference, lr=1e-3, loose=loose)


def test_gpt_whole_batch_forward_gives_the_models_logits():
    model = gpt()
    ids, labels = tokens()
    parallel = pipelined(model, "1f1b")
    np.testing.assert_allclose(parallel(ids).asnumpy(), model(ids).asnumpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="last stage returns \\(1, 8, 32\\), expected a scalar loss"):
        parallel.train_step(nn.Adam(parallel.optimizer_parameters(), 1e-3), ids)


class PaddedEncoder(nn.Cell):
    """MindSpore's TransformerEncoderLayers in a CellList, called with a key padding mask
    computed from the ids (a side input that depends on the input only), a tied embedding /
    output weight, and the loss in construct."""

    def __init__(self, vocab=16, hidden=16, layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.CellList([nn.TransformerEncoderLayer(hidden, 2, 32, dropout=0.0, batch_first=True)
                                   for _ in range(layers)])
        self.norm = nn.LayerNorm((hidden,))
        self.loss = nn.CrossEntropyLoss()

    def construct(self, ids, labels):
        padding = ids == 0
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding)
        logits = ops.matmul(self.norm(x), self.embed.embedding_table.T)  # tied with the embedding
        b, t, v = logits.shape
        return self.loss(logits.reshape(b * t, v), labels.reshape(b * t))


def test_mindspore_encoder_layers_with_a_padding_mask_and_tied_weights():
    def build():
        ms.set_seed(5)
        return PaddedEncoder()

    ids, labels = tokens(vocab=16, shape=(4, 6), seed=1)
    assert (ids.asnumpy() == 0).any()  # some keys are masked
    reference = single_device_run(build(), ids, labels, steps=3)
    model = build()
    parallel = pipelined(model, "1f1b", m=2)
    losses = train(parallel, (ids, labels), steps=3)
    tied = "embed.embedding_table"
    assert tied in {n for n, _ in parallel.stage_cells[0].parameters_and_names()}
    assert tied in {n for n, _ in parallel.stage_cells[1].parameters_and_names()}  # trained on both, summed
    # attention key biases have an exact gradient of 0 (softmax ignores a shift of all scores):
    # Adam turns its rounding noise into steps, so they are checked elementwise only
    loose = {p.name for p in model.trainable_params() if p.name.endswith("in_proj_bias")}
    assert_same_training(model, losses, reference, loose=loose)


class Blocks(nn.Cell):
    """Dense blocks in a CellList; `how` breaks the chain in one of several ways."""

    def __init__(self, how="chain"):
        super().__init__()
        ms.set_seed(0)
        self.blocks = nn.CellList([nn.Dense(4, 4) for _ in range(4)])
        self.scale = Parameter(Tensor(np.ones((4,), np.float32)), name="scale")
        self.how = how

    def construct(self, x):
        if self.how == "between":
            for i, block in enumerate(self.blocks):
                x = block(x) * 2 if i == 1 else block(x)
        elif self.how == "twice":
            x = self.blocks[1](self.blocks[0](x))
            x = self.blocks[1](x)
        elif self.how == "flat":  # the blocks' parameters used without calling the blocks
            for block in self.blocks:
                x = ops.matmul(x, block.weight.T) + block.bias
        elif self.how == "skip":
            for block in self.blocks[:3]:
                x = block(x)
        else:
            for block in self.blocks:
                x = block(x)
        return x.sum()


class SideBlock(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 4)

    def construct(self, x, side):
        return self.dense(x) + side


class ParamSide(nn.Cell):
    def __init__(self):
        super().__init__()
        self.blocks = nn.CellList([SideBlock() for _ in range(2)])
        self.proj = nn.Dense(4, 4)

    def construct(self, x):
        side = self.proj(x)  # depends on a parameter: stage 1 could not train it
        for block in self.blocks:
            x = block(x, side)
        return x.sum()


@pytest.mark.parametrize("model, match", [
    (lambda: Blocks("between"), r"Blocks.blocks is not a chain: no argument of block 2 is block 1's output"),
    (lambda: Blocks("twice"), r"block 1 is called 2 times \(the construct runs its blocks more than once"),
    (lambda: Blocks("skip"), r"called 3 of its 4 blocks"),
    (lambda: Blocks("flat"), r"never calls its blocks as Cells"),
    (lambda: ParamSide(), r"ParamSide.blocks\[0\]'s side input argument 1 depends on parameters or random ops"),
])
def test_a_construct_that_is_not_a_chain_is_refused_naming_the_call(model, match):
    parallel = pipelined(model(), "1f1b", m=2)
    x = Tensor(np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match=match):
        parallel.train_step(nn.SGD(parallel.optimizer_parameters(), 0.1), x)


def pipeline_config(*mesh):
    """A YAML-shaped config whose whole model is cut into the mesh's pipeline stages."""
    sizes, names = zip(*mesh)
    stages = sizes[names.index("pipeline")]
    return {"parallel_config": {"device_matrix": list(sizes), "alias_names": list(names),
                                "module_level": [{"name": "*", "strategy": {"pipeline": stages}}]}}


def test_a_config_alone_pipelines_gpt_and_trains_like_one_device(gpt_reference):
    mh.set_context(mode="simulation", device_num=2)
    model = gpt()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs as one SPMD program" warning
        parallel = mh.auto_parallelize(model, pipeline_config((2, "pipeline")))
    assert isinstance(parallel, PipelineModel) and parallel.schedule.kind == "1f1b"
    assert parallel.schedule.num_microbatches == 2  # the default m = p
    losses = train(parallel, tokens(), lr=1e-3)
    assert parallel.split == (2, 2)
    loose = {f"blocks.{i}.attn.qkv.bias" for i in range(4)}
    assert_same_training(model, losses, gpt_reference, lr=1e-3, loose=loose)


def test_pipeline_false_runs_a_config_with_stages_as_one_spmd_program_without_a_warning():
    mh.set_context(mode="simulation", device_num=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parallel = mh.auto_parallelize(gpt(), pipeline_config((2, "pipeline")), pipeline=False)
    assert isinstance(parallel, SimulatedModel)
    ids, labels = tokens()
    model = gpt()
    np.testing.assert_allclose(parallel(ids, labels).asnumpy(), model(ids, labels).asnumpy(), rtol=1e-5)


@pytest.mark.parametrize("value", ["1f1b", 2])
def test_a_pipeline_argument_of_another_type_is_refused_naming_the_choices(value):
    mh.set_context(mode="simulation", device_num=2)
    with pytest.raises(ValueError, match=r"pipeline=.*expected PipelineOptions, a mapping of its fields, True "
                                         r"\(defaults\), None, or False"):
        mh.auto_parallelize(gpt(), pipeline_config((2, "pipeline")), pipeline=value)


def test_pipeline_true_pipelines_with_the_defaults():
    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(gpt(), PIPELINE_2(tensor_map=()), pipeline=True)
    assert isinstance(parallel, PipelineModel) and parallel.schedule.kind == "1f1b" and not parallel.from_config


def test_a_config_alone_on_a_model_that_is_not_a_chain_is_refused_naming_the_opt_out():
    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(Blocks("between"), pipeline_config((2, "pipeline")))
    with pytest.raises(ValueError, match=r"no argument of block 2 is block 1's output.*"
                                         r"pipeline=False\) runs it as one SPMD program"):
        parallel.train_step(nn.SGD(parallel.optimizer_parameters(), 0.1), Tensor(np.ones((4, 4), np.float32)))


def test_gpt_on_a_data_by_pipeline_mesh_trains_like_one_device(gpt_reference):
    model = gpt()
    parallel = pipelined(model, "1f1b", m=2, mesh=Layout((2, 2), ("data", "pipeline")))
    losses = train(parallel, tokens(), lr=1e-3)
    assert set(parallel.stage_models) == {0, 1}  # each stage a SimulatedModel on its data sub-mesh
    loose = {f"blocks.{i}.attn.qkv.bias" for i in range(4)}
    assert_same_training(model, losses, gpt_reference, lr=1e-3, loose=loose)
    # each stage sums its gradients over its own data ranks
    assert {"data@stage0", "data@stage1"} <= set(parallel.report().comm_backward["AllReduce"])


def test_gpt_on_a_tensor_by_pipeline_mesh_trains_like_one_device(gpt_reference):
    mesh = Layout((2, 2), ("tensor", "pipeline"))
    strategy = mesh(tensor_map=()).override("blocks.*.fc1.weight", ("tensor", None)) \
        .override("blocks.*.fc2.weight", (None, "tensor"))
    mh.set_context(mode="simulation", device_num=4)
    model = gpt()
    parallel = mh.auto_parallelize(model, strategy, pipeline={"schedule": "1f1b", "microbatches": 2})
    losses = train(parallel, tokens(), lr=1e-3)
    loose = {f"blocks.{i}.attn.qkv.bias" for i in range(4)}
    assert_same_training(model, losses, gpt_reference, lr=1e-3, loose=loose)
    assert {"tensor@stage0", "tensor@stage1"} <= set(parallel.report().comm["AllReduce"])


def test_a_config_alone_pipelines_gpt_on_a_data_by_pipeline_mesh():
    mh.set_context(mode="simulation", device_num=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parallel = mh.auto_parallelize(gpt(), pipeline_config((2, "data"), (2, "pipeline")))
    assert isinstance(parallel, PipelineModel)


def test_under_msrun_a_cell_list_model_with_data_axes_is_refused_or_falls_back_naming_the_reason():
    from mindspore_hyper.pipeline.build import parallelize_pipeline
    from mindspore_hyper.strategy.resolve import resolve_strategy

    reason = (r"GPT\) is pipelined through its construct \(its nn.CellList 'blocks'\), which under msrun is "
              r"supported on a pipeline-only mesh only .* this mesh \(2, 2\) \('data', 'pipeline'\) has "
              r"data/tensor axes besides 'pipeline'")
    with pytest.raises(ValueError, match="pipeline: the model \\(" + reason):
        mh.auto_parallelize(gpt(), Layout((2, 2), ("data", "pipeline"))(tensor_map=()), mode="distributed",
                            pipeline={"schedule": "1f1b"})
    config = mh.load_parallel_config(pipeline_config((2, "data"), (2, "pipeline")))
    model = gpt()
    with pytest.warns(UserWarning, match=reason + ": it runs as one SPMD program"):
        assert parallelize_pipeline(model, resolve_strategy(model, config), DistributedRuntime()) is None


def test_two_equally_long_cell_lists_are_ambiguous():
    class Two(nn.Cell):
        def __init__(self):
            super().__init__()
            self.a = nn.CellList([nn.Dense(4, 4) for _ in range(2)])
            self.b = nn.CellList([nn.Dense(4, 4) for _ in range(2)])

        def construct(self, x):
            for cell in list(self.a) + list(self.b):
                x = cell(x)
            return x.sum()

    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(Two(), PIPELINE_2(tensor_map=()), pipeline={"schedule": "1f1b"})
    x = Tensor(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="several nn.CellLists of 2 Cells and the forward calls 2 of them: 'a' \\(2 "
                                         "block calls\\), 'b' \\(2 block calls\\)"):
        parallel.train_step(nn.Adam(parallel.optimizer_parameters(), 1e-3), x)
