"""The dry run's per-device figures equal the numeric simulation's, exactly: parameters,
gradients, optimizer states, peak activations, and every collective (kind, axis, count, bytes)
forward and backward, on the examples' GPT, a Llama-like model and MindSpore's own nn layers,
under data, tensor, sequence-split inputs, context parallelism (Ulysses and ring) and ZeRO-1."""
import contextlib
import math
import os
import sys
from fnmatch import fnmatch

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from sim_models import DenseStack, TinyLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), "examples"))
from models import GPT  # noqa: E402
from train_transformer import megatron_strategy  # noqa: E402


class BiasedAttention(nn.Cell):
    """Attention with a learned additive bias as its mask, returning a scalar."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Dense(8, 8)
        self.bias = Parameter(Tensor(np.zeros((8, 8), np.float32)), name="bias")

    def construct(self, x):
        q = self.proj(x)
        scores = ops.matmul(q, q.swapaxes(-1, -2)) + self.bias
        return ops.matmul(ops.softmax(scores, -1), q).mean()


def _report(mh, mode, devices, make_model, strategy, inputs, options=None):
    mh.set_context(mode=mode, device_num=devices)
    model = mh.auto_parallelize(make_model(), strategy)
    optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
    model.train_step(optimizer, *inputs, **(options or {}))
    return model.report(optimizer)


def _assert_same(mh, devices, make_model, strategy_fn, inputs, options=None):
    sim = _report(mh, "simulation", devices, make_model, strategy_fn(), inputs, options)
    dry = _report(mh, "dryrun", devices, make_model, strategy_fn(), inputs, options)
    assert sim.memory == dry.memory
    assert sim.comm == dry.comm
    assert sim.comm_backward == dry.comm_backward
    assert sim.comm_causes == dry.comm_causes  # what caused each collective (the op and input, grad sync, ...)
    assert sim.fallbacks == dry.fallbacks
    # the step's memory over forward, backward and the update (runtime/step_memory.py)
    assert sim.step_memory == dry.step_memory and dry.step_memory["timeline"]
    assert sim.comm_backward, "the case must move gradients (else the backward check is empty)"
    return dry


def _ids(batch, seq, vocab):
    return Tensor(np.random.default_rng(0).integers(0, vocab, (batch, seq)).astype(np.int32))


def test_gpt_data_tensor_zero1(pynative):
    ids = _ids(4, 16, 128)
    report = _assert_same(pynative, 4, GPT, lambda: megatron_strategy(4), (ids, ids))
    assert set(report.memory) == {0, 1, 2, 3}


def test_gpt_mixed_precision_float16_cells(pynative):
    """A model made mixed precision by `Cell.to_float(float16)` (LayerNorms kept float32, as amp O2
    keeps them): the dry run gives each op's outputs the dtype MindSpore's kernel launch casts to
    (float16 in float16 Cells; views and copies keep their input's), so activations, the working
    weights and every backward collective (tensor-parallel sums, ZeRO-1's data-axis gradient syncs)
    equal the simulation's byte for byte."""
    import mindspore as ms

    def make():
        net = GPT()
        net.to_float(ms.float16)
        for _, cell in net.cells_and_names():
            if isinstance(cell, nn.LayerNorm):
                cell.to_float(ms.float32)
        return net

    ids = _ids(4, 16, 128)
    sim = _report(pynative, "simulation", 4, make, megatron_strategy(4), (ids, ids))
    dry = _report(pynative, "dryrun", 4, make, megatron_strategy(4), (ids, ids))
    assert sim.memory == dry.memory and sim.memory_by_dtype == dry.memory_by_dtype
    assert sim.comm == dry.comm and sim.step_memory == dry.step_memory
    assert sim.comm_backward == dry.comm_backward
    by_dtype = dry.memory_by_dtype[0]
    assert set(by_dtype["working_weights"]) == {"float16"} and set(by_dtype["parameters"]) == {"float32"}
    # float16 activations: the forward peak is below the same model's in float32
    fp32 = _report(pynative, "dryrun", 4, GPT, megatron_strategy(4), (ids, ids))
    assert dry.memory[0]["activations_peak"] < fp32.memory[0]["activations_peak"]


def test_a_pipeline_counts_its_stages_working_weights(pynative):
    """A mixed-precision model cut into pipeline stages: each device's memory row has the
    float16 working copies of its pipeline rank's weights, counted by hand: 2 bytes per element
    of every parameter its stages hold except the LayerNorms' (kept float32); data 2 x pipeline 2,
    stages (embedding + block 0) and (block 1 + head)."""
    import mindspore as ms
    from models import PipelinedGPT

    pynative.set_context(mode="dryrun", device_num=4)
    net = PipelinedGPT(vocab=128, hidden=32, heads=4, layers=2, seq=16)
    net.to_float(ms.float16)
    for _, cell in net.cells_and_names():
        if isinstance(cell, nn.LayerNorm):
            cell.to_float(ms.float32)

    def half_bytes(*cells):
        return sum(2 * math.prod(p.shape) for c in cells for name, p in c.parameters_and_names()
                   if not name.split(".")[-1] in ("gamma", "beta"))

    expected = {0: half_bytes(net.embed, net.pos, net.blocks[0]), 1: half_bytes(net.blocks[1], net.head)}
    model = pynative.auto_parallelize(net, pynative.Layout((2, 2), ("data", "pipeline"))(tensor_map=()),
                                      pipeline={"schedule": "1f1b", "microbatches": 2, "layers_per_stage": (2, 2)})
    optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
    ids = _ids(4, 16, 128)
    model.train_step(optimizer, ids, ids)
    memory = model.report(optimizer).memory
    for device, row in memory.items():
        rank = model.mesh.coords(device)[1]
        assert row["working_weights"] == expected[rank], (device, row)
        assert row["total"] == sum(row[k] for k in ("parameters", "gradients", "optimizer_states", "activations_peak",
                                                    "working_weights"))


@pytest.mark.parametrize("mesh", [(4, 1), (2, 2)], ids=["data 4", "data 2 x tensor 2"])
def test_gpt_zero3_through_auto_parallelize(pynative, mesh):
    """ZeRO-3 through auto_parallelize: every parameter also split over "data" (the estimator's
    GPT layout, `estimate/gpt_layout.py`, as a parallel_config) with the optimizer states
    sharded. Memory, collectives and the step's series equal the simulation's; parameters and
    gradients are 1/(data x tensor) of the model's on every device. On data 2 x tensor 2 each
    weight is all-gathered over "data" for the op that reads it and its gradient reduce-scattered
    back; on data 4 alone the split lands on the weights' first dimension, so the planner moves
    activations too (all-to-alls), as the simulation does."""
    from mindspore_hyper.estimate import JobStrategy
    from mindspore_hyper.estimate.gpt_layout import gpt_parallel_config

    mh = pynative
    data, tensor = mesh
    config = gpt_parallel_config(JobStrategy(data=data, tensor=tensor, zero_stage=3))
    ids = _ids(4, 16, 128)
    dry = _assert_same(mh, 4, GPT, lambda: mh.load_parallel_config(config), (ids, ids))
    sizes = {"data": data, "tensor": tensor, None: 1}
    expected = 0  # by hand: each float32 parameter over the axes of its map (all divide evenly)
    for p in GPT().get_parameters():
        (tmap,) = [e["tensor_map"] for e in config["parallel_config"]["parameter_level"] if fnmatch(p.name, e["name"])]
        split = math.prod(sizes[a] for entry in tmap for a in (entry if isinstance(entry, tuple) else (entry,)))
        assert p.size % split == 0
        expected += p.size * 4 // split
    assert expected < sum(p.size for p in GPT().get_parameters()) * 4 // 2  # at most half the model per device
    assert all(m["parameters"] == m["gradients"] == expected and m["optimizer_states"] == 2 * expected
               for m in dry.memory.values())  # Adam's two states at the parameters' (ZeRO-3) layout
    assert dry.comm["AllGather"]["data"]["count"] > 0
    if tensor > 1:  # each weight gathered over "data" for its op, its gradient reduce-scattered back
        assert dry.comm_backward["ReduceScatter"]["data"]["count"] == dry.comm["AllGather"]["data"]["count"]


@pytest.mark.parametrize("options", [
    {"max_grad_norm": 1.0},
    {"accumulation_steps": 2},
    {"max_grad_norm": 1.0, "accumulation_steps": 4, "loss_scale": 2.0 ** 10},
], ids=["clip", "accumulate 2", "clip + accumulate 4 + loss scale"])
def test_gpt_with_train_step_options(pynative, options):
    """The dry run models train_step's options as the simulation accounts them: accumulation runs
    k micro-batch forwards (activations of one micro-batch at a time, every tensor-parallel
    collective k times, each parameter's data-parallel gradient sum once per step), clipping and
    loss scaling add no row."""
    ids = _ids(8, 16, 128)
    dry = _assert_same(pynative, 4, GPT, lambda: megatron_strategy(4), (ids, ids), options)
    plain = _report(pynative, "dryrun", 4, GPT, megatron_strategy(4), (ids, ids))
    steps = options.get("accumulation_steps", 1)
    assert dry.memory[0]["gradients"] == plain.memory[0]["gradients"]
    assert (dry.memory[0]["activations_peak"] < plain.memory[0]["activations_peak"]) == (steps > 1)
    assert dry.comm_backward["ReduceScatter"] == plain.comm_backward["ReduceScatter"]  # ZeRO-1's sums: once
    assert dry.comm_backward["AllReduce"]["tensor"]["count"] == steps * plain.comm_backward["AllReduce"]["tensor"][
        "count"]


def test_llama_like_tensor_parallel(pynative):
    mh = pynative

    def strategy():
        s = mh.Layout((2, 2), ("data", "tensor"))(tensor_map=())
        s.override("block.attn.q.*", "tensor").override("block.attn.k.*", "tensor").override("block.attn.v.*", "tensor")
        s.override("block.attn.proj.weight", None, "tensor")
        s.override("block.mlp.up.*", "tensor").override("block.mlp.down.weight", None, "tensor")
        return s.override("head.weight", "tensor")

    ids = _ids(4, 8, 64)
    _assert_same(mh, 4, TinyLM, strategy, (ids, ids))


def test_mindspore_layers_data_parallel_zero1(pynative):
    mh = pynative

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.body = DenseStack(n_layers=2, dim=16)
            self.norm = nn.LayerNorm((16,))
            self.loss = nn.MSELoss()

        def construct(self, x, y):
            return self.loss(self.body(self.norm(x)), y)

    x = Tensor(np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32))
    y = Tensor(np.zeros((8, 1), np.float32))
    _assert_same(mh, 4, Net, lambda: mh.Layout((4,), ("data",))(tensor_map=(), optimizer_state="data"), (x, y))


def test_moe_expert_parallel_with_balanced_routing(pynative):
    """The MoE example's data x expert x tensor mesh: the dry run routes balanced (it has no
    logits); the simulation with moe_routing="balanced" routes the same way and agrees exactly."""
    import moe_training

    mh = pynative
    ids = _ids(4, 8, 64)
    sim = dry = None
    for mode in ("simulation", "dryrun"):
        mh.set_context(mode=mode, device_num=8, moe_routing="balanced")
        model = mh.auto_parallelize(moe_training.MoEClassifier(), moe_training.strategy(8))
        optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
        model.train_step(optimizer, ids, ids)
        if mode == "simulation":
            sim, sim_ops = model.report(optimizer), _op_tables(model)
        else:
            dry, dry_ops = model.report(optimizer), _op_tables(model)
    assert sim.memory == dry.memory and sim.comm == dry.comm and sim.comm_backward == dry.comm_backward
    assert sim.comm_causes == dry.comm_causes
    assert "AllToAll" in dry.comm and "expert" in dry.comm["AllToAll"]
    # the op list the step-time model times, the routed experts' matmuls included (moe/expert_ops.py)
    assert sim_ops == dry_ops and any(op == "ExpertMatMul" for op, _, _ in dry_ops[()])


def _op_tables(model):
    """Every device program's op table ((op, FLOPs, bytes) -> calls: what the step-time model
    times): the representative's under (), each program of its own under its ranks."""
    acc = model.accounting
    return {(): dict(acc.compute), **{ranks: dict(v.compute) for ranks, v in acc.variants.items()}}


def _moe_reports(mh, devices, strategy, ids, **context):
    """(simulation report, dry-run report) of one training step of the MoE example, each with its
    op tables (`_op_tables`) as `report.op_tables`."""
    import moe_training

    reports = []
    for mode in ("simulation", "dryrun"):
        mh.set_context(mode=mode, device_num=devices, **context)
        model = mh.auto_parallelize(moe_training.MoEClassifier(), strategy)
        optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
        model.train_step(optimizer, ids, ids)
        reports.append(model.report(optimizer))
        reports[-1].op_tables = _op_tables(model)
    return reports


# a skewed routing histogram over the MoE example's 8 experts: of each device's 16 token copies
# (8 tokens, top-2) experts 0..7 get 4, 4, 2, 2, 1, 1, 1, 1
SKEWED = [0.25, 0.25, 0.125, 0.125, 0.0625, 0.0625, 0.0625, 0.0625]


def test_moe_expert_parallel_with_a_routing_histogram(pynative):
    """The MoE example on expert 4 (2 experts per member, member m = rank m) routed by a given
    skewed histogram: dry run = simulation exactly on every device, each expert member with its
    own figures, checked against a hand count. Every device routes alike, sending rows_to =
    8, 4, 2, 2 of its 16 copies to members 0..3; member m dispatches 16 - rows_to[m] rows to the
    others, combines back 3 x rows_to[m] (what each of the 3 others sent it) and its experts work
    on 4 x rows_to[m]:
    member 0: 8 + 24 = 32 rows of hidden 32 in float32 = 4096 bytes all-to-all, 32 expert rows;
    member 1: 12 + 12 = 24 rows = 3072 bytes, 16 rows (the balanced figures: 12 + 3 x 4);
    members 2 and 3: 14 + 6 = 20 rows = 2560 bytes, 8 rows."""
    import moe_training

    mh = pynative
    ids = _ids(4, 8, 64)  # 32 tokens: 8 per device over the 4 expert members
    sim, dry = _moe_reports(mh, 4, moe_training.strategy(4), ids, moe_routing=SKEWED)
    assert sim.memory == dry.memory and sim.comm == dry.comm and sim.comm_backward == dry.comm_backward
    assert sim.comm_causes == dry.comm_causes and sim.step_memory == dry.step_memory
    assert sim.programs == dry.programs and [p["ranks"] for p in dry.programs] == [[1], [2], [3]]
    for rank in range(4):  # every device's collectives, its program's
        assert sim.comm_of(rank) == dry.comm_of(rank)
    # every program's op list, the experts' matmuls on its own rows (hand count: tests/moe/test_expert_ops.py)
    assert sim.op_tables == dry.op_tables and set(dry.op_tables) == {(), (1,), (2,), (3,)}
    row_bytes = 32 * 4
    a2a = {rank: dry.comm_of(rank)["comm"]["AllToAll"]["expert"] for rank in range(4)}
    assert {rank: (v["count"], v["bytes"]) for rank, v in a2a.items()} == \
        {0: (2, 32 * row_bytes), 1: (2, 24 * row_bytes), 2: (2, 20 * row_bytes), 3: (2, 20 * row_bytes)}
    _, balanced = _moe_reports(mh, 4, moe_training.strategy(4), ids, moe_routing="balanced")
    assert balanced.comm["AllToAll"]["expert"]["bytes"] == 24 * row_bytes
    assert not balanced.programs  # balanced: every member alike, one program
    # the experts' activations (moe/expert_compute.py's model: in and out rows of hidden 32, four
    # SwiGLU products of ffn 48, float32) follow the rows each member received: 4 x rows_to[m]
    # against 4 x 4 balanced (the exchange buffers are transient: the peak is the step's end)
    per_row = (2 * 32 + 4 * 48) * 4
    for rank, rows in enumerate((32, 16, 8, 8)):
        assert dry.memory[rank]["activations_peak"] - balanced.memory[rank]["activations_peak"] == \
            (rows - 16) * per_row
    # member 1's loads are the balanced ones (4 rows to every member): its whole program is the
    # balanced run's; the others' step peaks follow their loads
    assert dry.memory[1] == balanced.memory[1] and dry.comm_of(1)["comm"] == balanced.comm
    assert dry.step_memory["programs"][0]["timeline"] == balanced.step_memory["timeline"]
    peaks = [dry.step_memory["per_device"][rank]["step_peak"] for rank in range(4)]
    assert peaks[0] > peaks[1] == balanced.step_memory["per_device"][1]["step_peak"] > peaks[2] == peaks[3]
    assert [p["ranks"] for p in dry.step_memory["programs"]] == [[1], [2], [3]]
    assert "devices 2: their own program" in str(dry)
    from mindspore_hyper.hyper_parallel.report import routing_text

    mh.set_context(moe_routing=SKEWED)
    assert routing_text(True).startswith("histogram: fractions [0.25, 0.25, 0.125, 0.125, 0.0625")


@pytest.mark.parametrize("routing", ["balanced", [0.5, 0.25, 0.125, 0.125]], ids=["balanced", "histogram"])
def test_moe_pipeline_x_experts(pynative, routing):
    """The package's MoE language model (examples/moe_lm.py, tiny) on data 2 x pipeline 2 x
    expert 2 with ZeRO-1, two stages of one MoE block each, 1F1B over 2 microbatches: every
    device's memory, every stage's collectives (expert all-to-alls included), the stage-boundary
    sends, each pipeline rank's step series and every stage program's op list (the experts'
    matmuls included), so its predicted step, equal the simulation's, balanced and under a skewed
    histogram."""
    from moe_lm import MoELM, moe_strategy

    from mindspore_hyper.cli.dryrun import add_predictions
    from mindspore_hyper.estimate.hardware import load_hardware
    from mindspore_hyper.hyper_parallel.report import session_report

    mh = pynative
    ids = _ids(8, 8, 32)  # data 2 x expert 2 x 2 microbatches
    reports, entries = [], []
    for mode in ("simulation", "dryrun"):
        mh.set_context(mode=mode, device_num=8, moe_routing=routing)
        model = mh.auto_parallelize(MoELM(vocab=32, hidden=8, heads=2, layers=2, seq=8, experts=4, top_k=2,
                                          expert_ffn=8, shared_ffn=8), moe_strategy(2, 2, 2),
                                    pipeline={"schedule": "1f1b", "microbatches": 2})
        optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
        model.train_step(optimizer, ids, ids)
        reports.append(model.report(optimizer))
        entries.append(session_report(mode, 8)["meshes"][-1])  # this model's (oldest first)
        add_predictions({"meshes": [entries[-1]]}, load_hardware("a100-80gb"))
    sim, dry = reports
    assert entries[0]["pipeline"] == entries[1]["pipeline"] and entries[0]["predicted"] == entries[1]["predicted"]
    stages = entries[1]["pipeline"]["per_stage"].values()
    assert all(any(row["op"] == "ExpertMatMul" for row in stage["compute"]) for stage in stages)
    # under the histogram each stage's expert member 1 has its own program (the stage's slowest is timed)
    assert all(("programs" in stage) == (routing != "balanced") for stage in stages)
    assert sim.memory == dry.memory and set(dry.memory) == set(range(8))
    assert sim.comm == dry.comm and sim.comm_backward == dry.comm_backward and sim.p2p == dry.p2p
    assert sim.comm_causes == dry.comm_causes and sim.step_memory == dry.step_memory
    assert {"expert@stage0", "expert@stage1"} <= set(dry.comm["AllToAll"]) and dry.p2p
    assert set(dry.step_memory["per_pipeline_rank"]) == {0, 1}


def test_a_bad_routing_histogram_is_refused_naming_the_field(pynative, monkeypatch):
    import moe_training
    from mindspore_hyper.moe import MoE
    from mindspore_hyper.moe.router import histogram_choice

    mh = pynative
    for bad, why in (([0.5, -0.25, 0.75], "negative or non-finite"), ([0.5, 0.25], "they sum to 0.75"),
                     ("uniform", "expected one of 'learned', 'balanced' or a routing histogram"),
                     ([True, False], "a routing histogram")):
        with pytest.raises(ValueError, match=f"moe_routing=.*{why}"):
            mh.set_context(moe_routing=bad)
    monkeypatch.setenv("MS_HYPER_MOE_ROUTING", "0.5,0.5")
    assert mh.get_context("moe_routing") == (0.5, 0.5)
    monkeypatch.setenv("MS_HYPER_MOE_ROUTING", "0.5,x")
    with pytest.raises(ValueError, match="MS_HYPER_MOE_ROUTING='0.5,x': expected"):
        mh.get_context("moe_routing")
    monkeypatch.delenv("MS_HYPER_MOE_ROUTING")
    mh.set_context(mode="dryrun", device_num=4, moe_routing=[0.25] * 4)  # 4 fractions, 8 experts
    model = mh.auto_parallelize(moe_training.MoEClassifier(), moe_training.strategy(4))
    ids = _ids(4, 8, 64)
    with pytest.raises(ValueError, match="moe_routing: a histogram of 4 fractions for a MoE layer of 8 experts"):
        model.train_step(nn.Adam(model.optimizer_parameters(), 1e-3), ids, ids)
    net = moe_training.MoEClassifier()
    net.moe = MoE(32, 48, num_experts=8, top_k=2, dispatch="hierarchical", expert_groups=2)
    mh.set_context(moe_routing=SKEWED)
    model = mh.auto_parallelize(net, moe_training.strategy(4))
    with pytest.raises(NotImplementedError, match=r"dry run: MoE\(dispatch='hierarchical'\) under a moe_routing "
                                                  r"histogram is not modelled"):
        model.train_step(nn.Adam(model.optimizer_parameters(), 1e-3), ids, ids)
    with pytest.raises(ValueError, match=r"moe_routing: expert 0's fraction 0.75 gives 12 of the 16 token copies of "
                                         r"8 tokens; .* no fraction may exceed 1/top_k = 0.5"):
        histogram_choice(8, [0.75, 0.25], 2)
    choice = histogram_choice(8, [0.375, 0.125, 0.5], 2)  # 6, 2, 8 copies; a token's two experts distinct
    assert np.bincount(choice.ravel()).tolist() == [6, 2, 8] and (choice[:, 0] != choice[:, 1]).all()


def test_a_lazily_built_model_is_never_initialised(pynative):
    """Built under MindSpore's no_init_parameters(): the dry run reads shapes only; the same
    model in simulation initialises on first use, equal to an ordinary build with the seed."""
    import mindspore as ms
    from mindspore.nn.utils import no_init_parameters

    mh = pynative
    ids = _ids(4, 16, 128)
    mh.set_context(mode="dryrun", device_num=4)
    with no_init_parameters():
        net = GPT()
        model = mh.auto_parallelize(net, megatron_strategy(4))
        optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
    model.train_step(optimizer, ids, ids)
    assert all(p.has_init for p in net.get_parameters())
    losses = []
    for lazy in (True, False):
        mh.set_context(mode="simulation", device_num=4)
        ms.set_seed(3)
        with no_init_parameters() if lazy else contextlib.nullcontext():
            net = GPT()
            model = mh.auto_parallelize(net, megatron_strategy(4))
            optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
        losses.append([float(model.train_step(optimizer, ids, ids).asnumpy()) for _ in range(2)])
    assert losses[0] == losses[1]


@pytest.mark.parametrize("mesh", [((4,), ("cp",)), ((2, 2), ("data", "cp"))], ids=["cp4", "data2 x cp2"])
def test_gpt_ulysses_context_parallel(pynative, mesh):
    """The examples' GPT with Ulysses context parallelism (ZeRO-1 over data where there is one):
    the sequence -> head AllToAlls forward and backward, and the memory, equal the simulation's."""
    def strategy():
        return pynative.Layout(*mesh)(tensor_map=(), context_parallel="cp", context_method="ulysses",
                                      optimizer_state="data" if "data" in mesh[1] else None)

    ids = _ids(2, 8, 16)
    dry = _assert_same(pynative, 4, lambda: GPT(vocab=16, hidden=8, heads=4, layers=1, seq=8), strategy, (ids, ids))
    assert dry.comm["AllToAll"]["cp"]["count"] > 0 and dry.comm_backward["AllToAll"]["cp"]["count"] > 0


@pytest.mark.parametrize("mesh, seq, zigzag", [
    (((4,), ("cp",)), 8, True),
    (((2, 2), ("data", "cp")), 8, True),
    (((4,), ("cp",)), 12, False),
], ids=["cp4 zigzag", "data2 x cp2 zigzag", "cp4 contiguous"])
def test_gpt_ring_context_parallel(pynative, mesh, seq, zigzag):
    """The examples' GPT with ring context parallelism (the default method; ZeRO-1 over data
    where there is one): the dry run finds the causal mask's skipped blocks from positions (the
    zigzag order where the sequence divides by 2 x cp), and its K/V shifts, zigzag permutes and
    memory equal the simulation's, forward and backward."""
    def strategy():
        return pynative.Layout(*mesh)(tensor_map=(), context_parallel="cp",
                                      optimizer_state="data" if "data" in mesh[1] else None)

    ids = _ids(2, seq, 16)
    dry = _assert_same(pynative, 4, lambda: GPT(vocab=16, hidden=8, heads=4, layers=1, seq=seq), strategy, (ids, ids))
    n = dict(zip(mesh[1], mesh[0]))["cp"]
    # per layer: n-1 K/V shifts forward, n+1 backward; zigzag adds permutes of q, k^T, v and the
    # output forward, and of dout, its row sums, dq, dk^T and dv backward
    assert dry.comm["P2P"]["cp"]["count"] == n - 1 + (4 if zigzag else 0)
    assert dry.comm_backward["P2P"]["cp"]["count"] == n + 1 + (5 if zigzag else 0)


class CausalSdpa(nn.Cell):
    """Converted models' attention: scaled_dot_product_attention(is_causal=True), whose causal
    mask is a boolean fill mask built on the host."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Dense(8, 24)

    def construct(self, x):
        from mindspore_hyper.migrate.generated_support import scaled_dot_product_attention

        b, t, _ = x.shape
        q, k, v = (p.reshape(b, t, 2, 4).transpose(0, 2, 1, 3) for p in self.qkv(x).split(8, -1))
        return scaled_dot_product_attention(q, k, v, is_causal=True).mean()


def test_converted_causal_attention_ring_context_parallel(pynative):
    x = Tensor(np.random.default_rng(5).standard_normal((2, 8, 8)).astype(np.float32))
    dry = _assert_same(pynative, 4, CausalSdpa, lambda: pynative.Layout((4,), ("cp",))(
        tensor_map=(), context_parallel="cp"), (x,))
    assert dry.comm["P2P"]["cp"]["count"] == 3 + 4  # zigzag: the fill mask's empty blocks were found


def test_refusals_name_what_the_dry_run_cannot_do(pynative):
    from mindspore_hyper.dtensor.meta import DryRunValueError

    mh = pynative
    mh.set_context(mode="dryrun", device_num=4)
    import pipeline_training

    mh.set_context(device_num=2)
    with pytest.raises(ValueError, match="dry run: a pipeline over a mesh of the 'pipeline' axis alone"):
        mh.auto_parallelize(pipeline_training.build_model(), mh.Layout((2,), ("pipeline",))(tensor_map=()),
                            pipeline={"schedule": "1f1b", "microbatches": 4})
    mh.set_context(device_num=8)
    traced = mh.auto_parallelize(GPT(), mh.Layout((2, 2, 2), ("data", "pipeline", "tensor"))(tensor_map=()),
                                 pipeline={"schedule": "1f1b", "microbatches": 2})
    ids = _ids(4, 16, 128)
    with pytest.raises(ValueError, match=r"dry run: GPT is pipelined through its construct.*pipeline_layers\(\)"):
        traced.train_step(nn.Adam(traced.optimizer_parameters(), 1e-3), ids, ids)
    from mindspore_hyper.runtime.dryrun import DryRunRuntime

    with pytest.raises(ValueError, match="dry run: device groups are not modelled"):
        DryRunRuntime().check_composition("device groups")
    mh.set_context(device_num=4)
    model = mh.auto_parallelize(GPT(), megatron_strategy(4))
    optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
    with pytest.raises(ValueError, match=r"max_grad_norm=0: expected a finite number > 0"):
        model.train_step(optimizer, ids, ids, max_grad_norm=0)
    with pytest.raises(ValueError, match=r"accumulation_steps=3: input 0 \(shape \(4, 16\)\) has batch size 4"):
        model.train_step(optimizer, ids, ids, accumulation_steps=3)
    with pytest.raises(ValueError, match=r"loss_scale=0.5: expected None, a number >= 1"):
        model.train_step(optimizer, ids, ids, loss_scale=0.5)
    loss = model.train_step(optimizer, ids, ids)
    with pytest.raises(DryRunValueError,
                       match=r"asnumpy\(\) of a tensor of shape \(\) .*test_dryrun_equals_simulation"):
        loss.asnumpy()
    assert mh.dryrun_mock(1.5, lambda: loss.asnumpy()) == 1.5
    ring_refusal = (r"dry run: context_parallel='cp' with context_method='ring' \(the default\) is not modelled: ring "
                    r"attention reads the attention mask's values.*; ")
    scattered = GPT(vocab=16, hidden=8, heads=4, layers=1, seq=8)  # a constant mask with no diagonal structure
    scattered.mask = Tensor(np.where(np.random.default_rng(4).random((8, 8)) < 0.3, -1e9, 0.0).astype(np.float32))
    biased = BiasedAttention()  # a learned mask: computed by the run
    for net, why in ((scattered, "the mask of score step 1 .* is a constant without one diagonal structure"),
                     (biased, r"the mask of score step 0 .* is computed by the run \(from inputs or parameters\)")):
        ring = mh.auto_parallelize(net, mh.Layout((4,), ("cp",))(tensor_map=(), context_parallel="cp"))
        inputs = (_ids(2, 8, 16),) * 2 if net is scattered else (Tensor(np.ones((2, 8, 8), np.float32)),)
        with pytest.raises(ValueError, match=ring_refusal + why):
            ring.train_step(nn.Adam(ring.optimizer_parameters(), 1e-3), *inputs)
    from mindspore_hyper.offload import OffloadPolicy, hyper_offload

    # a plain Cell in a dry-run script (a dry-run model offloads: tests/offload/test_offload_dryrun.py)
    with pytest.raises(NotImplementedError, match="hyper_offload in a dry run of a Dense: offload the model "
                                                  "auto_parallelize returns"):
        hyper_offload(nn.Dense(4, 4), OffloadPolicy(), optimizer=lambda ps: nn.Adam(ps, 1e-3))
    mh.set_context(mode="simulation")
    assert mh.dryrun_mock(1.5, lambda: 2.5) == 2.5


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_stages_like_the_simulation(pynative, schedule):
    """The pipeline example's MindSpore layers, data 2 x pipeline 2: every device's memory (stage
    inputs in flight as activations), the stages' collectives, the stage-boundary sends and the
    step's memory series of each pipeline rank (pipeline/pipeline_step_memory.py)."""
    import pipeline_training

    mh = pynative
    x = Tensor(np.random.default_rng(2).standard_normal((8, 16)).astype(np.float32))
    y = Tensor(np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32))
    reports = {}
    for mode in ("simulation", "dryrun"):
        mh.set_context(mode=mode, device_num=4)
        model = mh.auto_parallelize(pipeline_training.build_model(), mh.Layout((2, 2), ("data", "pipeline"))(
            tensor_map=()), pipeline={"schedule": schedule, "microbatches": 4})
        optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
        model.train_step(optimizer, x, y)
        reports[mode] = model.report(optimizer)
    sim, dry = reports["simulation"], reports["dryrun"]
    assert sim.memory == dry.memory and set(dry.memory) == {0, 1, 2, 3}
    assert sim.comm == dry.comm and sim.comm_backward == dry.comm_backward and sim.p2p == dry.p2p
    assert sim.comm_causes == dry.comm_causes and dry.comm_causes["backward"]
    assert dry.p2p and dry.comm_backward
    assert sim.step_memory == dry.step_memory and set(dry.step_memory["per_pipeline_rank"]) == {0, 1}
    assert set(dry.step_memory["per_device"]) == {0, 1, 2, 3}


@pytest.mark.parametrize("strategy", ["data 4, ZeRO-1", "data 2 x pipeline 2, ZeRO-1", "data 2 x tensor 4, ZeRO-3"])
def test_gpt_at_a_size_no_simulation_holds_agrees_with_the_estimator(pynative, strategy):
    """The estimator's GPT formulas against the dry run of a GPT too large to simulate here
    (hidden 2048, 8 layers, sequence 1024, vocabulary 32000: 0.5 G parameters, ~40 GB of values
    per simulated step): model states exactly; activations (the estimator's "simulation"
    accounting model) within 5%, as its cross-check against the simulation allows, where that
    model applies (no tensor parallelism)."""
    from mindspore_hyper.estimate import JobStrategy, preset
    from mindspore_hyper.estimate.crosscheck import crosscheck_gpt

    jobs = {"data 4, ZeRO-1": JobStrategy(data=4, zero_stage=1, activation_model="simulation"),
            "data 2 x pipeline 2, ZeRO-1": JobStrategy(data=2, pipeline=2, zero_stage=1, activation_model="simulation"),
            "data 2 x tensor 4, ZeRO-3": JobStrategy(data=2, tensor=4, zero_stage=3)}
    config = preset("gpt-example").with_(vocab=32000, hidden=2048, ffn=4 * 2048, heads=16, kv_heads=16, layers=8,
                                         seq_len=1024, micro_batch=1)
    rows = crosscheck_gpt(GPT, config, jobs[strategy], shapes_only=True)
    assert len({r.rank for r in rows}) == jobs[strategy].devices
    for r in rows:
        if r.kind != "activations":
            assert r.estimated == r.measured, r
        elif jobs[strategy].tensor == 1:
            assert abs(r.relative_error) < 0.05, r
