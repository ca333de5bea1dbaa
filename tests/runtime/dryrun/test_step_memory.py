"""The step's memory over forward, backward and the update (runtime/step_memory.py), by hand on a
2-layer MLP, equal in simulation and dry run; the allocator's rounding and the fragmentation
allowance (context flags allocator_alignment, allocator_fragmentation)."""
import math

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.runtime.step_memory import round_block, step_memory

B, D, F, O = 3, 8, 16, 4  # rows per device (global 6 on data 2), input, hidden, output; float32
X, Y = 6 * D * 4, B * D * 4  # global x laid out replicated, then its batch shard
XG, YS = 6 * O * 4, B * O * 4  # global y, its shard
H, OUT, SCALAR = B * F * 4, B * O * 4, 4
W1, W2 = D * F * 4, F * O * 4


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w1 = Parameter(Tensor(np.full((D, F), 0.1, np.float32)), name="w1")
        self.w2 = Parameter(Tensor(np.full((F, O), 0.1, np.float32)), name="w2")

    def construct(self, x, y):
        out = ops.matmul(ops.relu(ops.matmul(x, self.w1)), self.w2)
        return ((out - y) ** 2).mean()


def _report(mh, mode, accumulation_steps=1):
    """One training step on data 2 of 6 x accumulation_steps rows (3 per device and micro-batch)."""
    mh.set_context(mode=mode, device_num=2)
    model = mh.auto_parallelize(MLP(), mh.Layout((2,), ("data",))(tensor_map=()))
    optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
    rows = 6 * accumulation_steps
    x, y = Tensor(np.ones((rows, D), np.float32)), Tensor(np.ones((rows, O), np.float32))
    model.train_step(optimizer, x, y, accumulation_steps=accumulation_steps)
    return model, model.report(optimizer)


def _expected_exact():
    """By hand: the inputs (x and y laid out whole, then cut by rows) are held from the start;
    each op holds its output (MeanExt: the mean and the loss, two scalars); a backward holds the
    activations up to its op plus the op's output-sized incoming gradient; w2's gradient appears
    in the backward of the second MatMul (its last reader), w1's in the first's."""
    inputs = X + Y + XG + YS
    outputs = [("MatMulExt", H), ("ReLU", H), ("MatMulExt", OUT), ("SubExt", OUT), ("PowTensorScalar", OUT),
               ("MeanExt", 2 * SCALAR)]
    forward, held = [], inputs
    for op, nbytes in outputs:
        held += nbytes
        forward.append(["forward", op, held, 0])
    grads_after = {2: W2, 0: W1}  # op index -> gradient appearing in its backward
    backward, grads = [], 0
    for i in range(len(outputs) - 1, -1, -1):
        grads += grads_after.get(i, 0)
        backward.append(["backward", outputs[i][0], forward[i][2] + outputs[i][1], grads])
    return forward + backward + [["optimizer", "update", 0, W1 + W2]]


def test_the_backward_timeline_by_hand(pynative):
    _, report = _report(pynative, "simulation")
    section = report.step_memory
    assert section["timeline"] == _expected_exact()
    # peak: the first MatMul's backward, inputs + h + its incoming gradient + both weight gradients
    assert (section["peak_phase"], section["peak_op"]) == ("backward", "MatMulExt")
    peak = X + Y + XG + YS + 2 * H + W1 + W2
    adam = 2 * (W1 + W2)  # m and v
    assert report.memory[0]["optimizer_states"] == adam
    for rank in (0, 1):
        assert section["per_device"][rank]["step_peak"] == W1 + W2 + adam + peak
    assert "step peak (forward, backward, update; device 0): 3.80 KiB in the backward of MatMulExt" in str(report)
    # the forward's figures are unchanged: activations_peak is the forward's end
    assert report.memory[0]["activations_peak"] == _expected_exact()[5][2]


def test_rounding_and_fragmentation_by_hand(pynative):
    """MindSpore's pool rounds every block up to 512 bytes, and all of this MLP's are smaller: 4 input
    blocks, one per op (two for MeanExt); the rounded peak moves to MeanExt's backward (its 2
    scalars and their 2 gradients: 4 blocks where the MatMul's backward had 2 + 2 gradients)."""
    pynative.set_context(allocator_fragmentation=0.25)
    _, report = _report(pynative, "dryrun")
    section = report.step_memory
    blocks_at_meanext_backward = 4 + 5 + 2 + 2  # inputs, the ops before, MeanExt's 2, its 2 gradients
    assert (section["rounded_peak_phase"], section["rounded_peak_op"]) == ("backward", "MeanExt")
    assert section["alignment_bytes"] == 512 and section["fragmentation"] == 0.25
    rounded = 512 * (2 + 4 + blocks_at_meanext_backward)  # + 2 weights and 4 Adam states, 512 each
    assert section["per_device"][0]["step_peak_rounded"] == rounded
    assert section["per_device"][0]["step_peak_with_fragmentation"] == math.ceil(rounded * 1.25)


def test_alignment_one_is_exact(pynative):
    pynative.set_context(allocator_alignment=1)
    _, report = _report(pynative, "dryrun")
    row = report.step_memory["per_device"][1]
    assert row["step_peak_rounded"] == row["step_peak"] == row["step_peak_with_fragmentation"]


def test_simulation_and_dry_run_agree_with_gradient_accumulation(pynative):
    """Two micro-batches: the series covers the last one, every gradient alive from its start."""
    reports = {mode: _report(pynative, mode, accumulation_steps=2)[1] for mode in ("simulation", "dryrun")}
    assert reports["simulation"].step_memory == reports["dryrun"].step_memory
    timeline = reports["dryrun"].step_memory["timeline"]
    assert [row[0] for row in timeline] == ["forward"] * 6 + ["backward"] * 6 + ["optimizer"]
    assert all(row[3] == W1 + W2 for row in timeline)


def test_a_frozen_parameter_gets_no_gradient(pynative):
    pynative.set_context(mode="dryrun", device_num=2)
    net = MLP()
    net.w1.requires_grad = False
    model = pynative.auto_parallelize(net, pynative.Layout((2,), ("data",))(tensor_map=()))
    optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
    model.train_step(optimizer, Tensor(np.ones((6, D), np.float32)), Tensor(np.ones((6, O), np.float32)))
    assert model.report(optimizer).step_memory["timeline"][-1] == ["optimizer", "update", 0, W2]


def test_round_block_is_mindsporess_align_memory_size():
    # DynamicMemPool::AlignMemorySize: 0 -> 512, 1 -> 512, 512 -> 512, 513 -> 1024
    assert [round_block(n, 512) for n in (0, 1, 512, 513)] == [512, 512, 512, 1024]
    assert round_block(513, 1) == 513


def test_bad_flags_and_alignment_are_named(pynative):
    with pytest.raises(ValueError, match=r"allocator_fragmentation=-0.1: expected a fraction in \[0, 1\]"):
        pynative.set_context(allocator_fragmentation=-0.1)
    with pytest.raises(ValueError, match=r"allocator_alignment=0: expected an int in \[1, 1048576\]"):
        pynative.set_context(allocator_alignment=0)
    model, _ = _report(pynative, "dryrun")
    with pytest.raises(ValueError, match=r"alignment=0: expected an int >= 1"):
        step_memory(model.accounting, 0)


def test_every_preset_rounds_as_mindsporess_pool_and_cites_it():
    from mindspore_hyper.estimate.hardware import hardware_presets, load_hardware

    for name in hardware_presets():
        hw = load_hardware(name)
        assert (hw.allocator_alignment, hw.fragmentation) == (512, 0.0), name
        assert "dynamic_mem_pool.h" in hw.sources["allocator"], name


@pytest.mark.parametrize("allocator, match", [
    ({"alignment_bytes": 0}, r"field 'allocator.alignment_bytes': expected an int >= 1, got 0"),
    ({"fragmentation": 1.5}, r"field 'allocator.fragmentation': expected a number >= 0 and <= 1, got 1.5"),
    ({"rounding": 512}, r"field allocator.rounding: unknown; expected one of alignment_bytes, fragmentation"),
])
def test_a_bad_allocator_field_is_named(allocator, match):
    import os

    from mindspore_hyper.comm.topology import read_yaml
    from mindspore_hyper.estimate.hardware import HARDWARE_DIR, hardware_from_dict

    data = dict(read_yaml(os.path.join(HARDWARE_DIR, "ascend-910c.yaml"), "hardware"), allocator=allocator)
    with pytest.raises(ValueError, match=match):
        hardware_from_dict(data, "ascend-910c.yaml")


def _pipeline_report(mh, mode, schedule):
    """The pipeline example's 9 MindSpore layers on data 2 x pipeline 2 (stages of layers [4, 5]),
    batch 8 in 4 microbatches of 2 rows: one training step."""
    import sys

    from paths import EXAMPLES

    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import pipeline_training

    mh.set_context(mode=mode, device_num=4)
    model = mh.auto_parallelize(pipeline_training.build_model(), mh.Layout((2, 2), ("data", "pipeline"))(
        tensor_map=()), pipeline={"schedule": schedule, "microbatches": 4})
    optimizer = nn.Adam(model.optimizer_parameters(), 1e-3)
    rng = np.random.default_rng(2)
    model.train_step(optimizer, Tensor(rng.standard_normal((8, 16)).astype(np.float32)),
                     Tensor(rng.standard_normal((8, 4)).astype(np.float32)))
    return model, model.report(optimizer), optimizer


def test_a_pipeline_ranks_series_follows_its_1f1b_schedule_by_hand(pynative):
    """The last pipeline rank under 1F1B runs F0 B0 F1 B1 F2 B2 F3 B3: each forward keeps its
    microbatch's stage input (2 rows x 32 float32 = 256 bytes, counted whole as the runner keeps
    it); each backward is the stage's own series (its recompute's forward ops, then their
    backwards) on top of that kept input; from the second microbatch on the first one's
    gradients (all 8976 bytes of stage 1's parameters: 2 x (32x32 + 32) + 32x4 + 4 floats) stay
    alive beside the new ones; the update holds every gradient."""
    model, report, optimizer = _pipeline_report(pynative, "simulation", "1f1b")
    kept, grads = 2 * 32 * 4, 4 * (2 * (32 * 32 + 32) + 32 * 4 + 4)
    stage = model.stage_models[1].report(optimizer).step_memory["timeline"][:-1]  # without its update
    expected, accumulated = [], 0
    for k in range(4):
        expected.append(["forward", f"stage 1 microbatch {k} (inputs kept)", kept, accumulated])
        expected += [[phase, f"{op} (stage 1 microbatch {k}{', recomputed' if phase == 'forward' else ''})",
                      kept + act, accumulated + g] for phase, op, act, g in stage]
        accumulated = grads
    expected.append(["optimizer", "update", 0, grads])
    section = report.step_memory
    assert section["per_pipeline_rank"][1]["timeline"] == expected
    for device in (1, 3):  # pipeline rank 1 (mesh coordinates (d, 1))
        m = report.memory[device]
        assert m["gradients"] == grads
        assert section["per_device"][device]["step_peak"] == \
            m["parameters"] + m["optimizer_states"] + max(act + g for _, _, act, g in expected)
    # the kept inputs' peak is the report's pipeline activations (1F1B's first rank keeps 2 microbatches)
    first = section["per_pipeline_rank"][0]["timeline"]
    assert max(row[2] for row in first if row[1].endswith("(inputs kept)")) == report.memory[0]["activations_peak"]


def test_a_zero_bubble_pipeline_makes_gradients_in_its_weight_passes(pynative):
    """zb_h1 splits each backward into the input-gradient pass (no parameter gradient) and the
    weight pass (the stage's gradients; the first stage's input pass runs nothing); the series
    equals the dry run's, and the update holds each rank's stage gradients."""
    runs = {mode: _pipeline_report(pynative, mode, "zb_h1") for mode in ("simulation", "dryrun")}
    reports = {mode: run[1] for mode, run in runs.items()}
    sim = reports["simulation"]
    model, _, optimizer = runs["simulation"]
    stage0 = model.stage_models[0].report(optimizer).step_memory["timeline"][:-1]
    first_rank = sim.step_memory["per_pipeline_rank"][0]["timeline"]
    assert len(first_rank) == 4 + 4 * len(stage0) + 1  # 4 forwards, 4 weight passes' series, the update
    assert sim.step_memory == reports["dryrun"].step_memory
    for rank, device in ((0, 0), (1, 1)):
        timeline = sim.step_memory["per_pipeline_rank"][rank]["timeline"]
        assert timeline[-1] == ["optimizer", "update", 0, sim.memory[device]["gradients"]]
        # the first microbatch's input pass of the last stage makes no parameter gradient
        first_backward = next(row for row in timeline if row[0] == "backward")
        assert first_backward[3] == 0
