"""The routed experts' work in the op list the step-time model times (moe/expert_ops.py): each
expert member's matmuls with their shapes, counted by hand, and the mesh's predicted step the
slowest member's. (Dry run = simulation for these ops: tests/runtime/dryrun/test_dryrun_equals_simulation.py.)"""
import sys

import numpy as np
import pytest
from mindspore import Tensor, nn

from paths import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
import moe_training  # noqa: E402

H, F = moe_training.HIDDEN, 48  # the MoE example's experts: hidden 32, feed-forward 48
# of each device's 16 token copies (8 tokens, top-2) experts 0..7 get 4, 4, 2, 2, 1, 1, 1, 1 (SKEWED),
# or 1, 1, 1, 1, 2, 2, 4, 4 (reversed)
SKEWED = [0.25, 0.25, 0.125, 0.125, 0.0625, 0.0625, 0.0625, 0.0625]


def _dry_run(mh, devices, routing):
    """One dry-run training step of the MoE example; its session report with predictions on a100-80gb."""
    from mindspore_hyper.cli.dryrun import add_predictions
    from mindspore_hyper.estimate.hardware import load_hardware
    from mindspore_hyper.hyper_parallel.report import session_report

    mh.set_context(mode="dryrun", device_num=devices, moe_routing=routing)
    model = mh.auto_parallelize(moe_training.MoEClassifier(), moe_training.strategy(devices))
    model.train_step(nn.Adam(model.optimizer_parameters(), 1e-3), *[Tensor(np.zeros((4, 8), np.int32))] * 2)
    report = session_report("dryrun", devices)
    add_predictions(report, load_hardware("a100-80gb"))
    return report["meshes"][-1]  # this model's (an earlier test's model may still be alive: oldest first)


def _expert_matmul_flops(rows) -> int:
    return sum(r["flops"] * r["calls"] for r in rows if r["op"] == "ExpertMatMul")


def _forward_flops(rows_per_slot, ffn) -> int:
    """By hand, one device's expert FLOPs forward: per slot of n rows the three matmuls (gate and up
    (n x H) @ (H x F), down (n x F) @ (F x H)) 3 x 2 n H F, and SwiGLU's sigmoid and two products
    n F each."""
    return sum(3 * 2 * n * H * ffn + 3 * n * ffn for n in rows_per_slot)


@pytest.mark.parametrize("devices, routing, slot_rows, ffn", [
    # expert 4 (2 experts per member), balanced: every expert 2 copies from each of 4 devices, n = 8
    # per slot; matmul FLOPs per member 2 slots x 3 x 2 x 8 x 32 x 48 = 147 456 forward, 442 368 with
    # the backward's 2x
    (4, "balanced", {0: (8, 8), 1: (8, 8), 2: (8, 8), 3: (8, 8)}, F),
    # SKEWED: member m's slots receive 4 x (4, 4), (2, 2), (1, 1), (1, 1) rows; member 0: 2 x 3 x 2 x
    # 16 x 32 x 48 = 294 912 forward (884 736 with backward), member 1 the balanced 147 456, members
    # 2 and 3 73 728 (221 184)
    (4, SKEWED, {0: (16, 16), 1: (8, 8), 2: (4, 4), 3: (4, 4)}, F),
    # reversed: members 0 and 1 4 rows per slot, member 2 8, member 3 16: the slowest is member 3
    (4, SKEWED[::-1], {0: (4, 4), 1: (4, 4), 2: (8, 8), 3: (16, 16)}, F),
    # data 2 x expert 2 x tensor 2 (4 experts per member, F split over "tensor": F_local 24), balanced:
    # each expert 2 copies from each of the 2 members' devices, n = 4 per slot; 4 x 3 x 2 x 4 x 32 x 24
    # = 73 728 forward per device (221 184 with backward)
    (8, "balanced", {rank: (4, 4, 4, 4) for rank in range(8)}, F // 2),
], ids=["balanced", "skewed", "reversed", "tensor-parallel-experts"])
def test_expert_flops_per_member_by_hand(pynative, devices, routing, slot_rows, ffn):
    mesh = _dry_run(pynative, devices, routing)
    programs = {p["devices"]: p for p in mesh["programs"]}
    by_rank = {}
    for rank in range(devices):  # each device's own program (the representative's unless listed)
        by_rank[rank] = next((p for label, p in programs.items() if str(rank) in label.split(",")), mesh)
    for rank, rows in slot_rows.items():
        compute = by_rank[rank]["compute"]
        assert _expert_matmul_flops(compute) == sum(3 * 2 * n * H * ffn for n in rows), rank
        assert sum(r["flops"] * r["calls"] for r in compute if r["op"].startswith("Expert")) == \
            _forward_flops(rows, ffn)
    # the step-time model counts them, backward as twice the forward: the members' predicted FLOPs
    # differ by 3 x their expert FLOPs' difference (every other op is the same on every member)
    own = {rank: _representative(mesh) if p is mesh else p["predicted"] for rank, p in by_rank.items()}
    for rank, rows in slot_rows.items():
        assert own[rank]["flops_per_device"] - own[0]["flops_per_device"] == \
            3 * (_forward_flops(rows, ffn) - _forward_flops(slot_rows[0], ffn))
    # the mesh's prediction is its slowest program's: the member with the most rows
    heaviest = max(slot_rows, key=lambda rank: sum(slot_rows[rank]))
    assert mesh["predicted"]["step_seconds"] == max(p["step_seconds"] for p in own.values())
    if sum(slot_rows[heaviest]) > sum(slot_rows[0]):
        assert mesh["predicted"]["slowest_devices"] == str(heaviest)
        assert mesh["predicted"]["step_seconds"] > own[0]["step_seconds"]
        from mindspore_hyper.hyper_parallel.report import format_report

        text = format_report({"mode": "dryrun", "devices": devices, "meshes": [mesh]})
        assert f"the slowest program's: devices {heaviest}" in text
    else:
        assert mesh["predicted"]["slowest_devices"] is None


def _representative(mesh):
    """The representative's prediction: the mesh's own ops and collectives timed alone."""
    from mindspore_hyper.estimate.dryrun_time import predict_step
    from mindspore_hyper.estimate.hardware import load_hardware

    return predict_step(mesh, load_hardware("a100-80gb")).to_dict()


def test_expert_ops_follow_the_dispatchers_cost_convention():
    """A slot's matmuls cost what `dtensor.op_cost` gives MindSpore's MatMul on the same shapes
    (2 x output elements x inner dimension; operands read plus result written); an empty slot runs
    nothing."""
    from mindspore_hyper.dtensor.op_cost import op_flops
    from mindspore_hyper.moe.expert_ops import expert_ops

    n, h, f = 5, 6, 7
    ops = expert_ops([n, 0], h, f, itemsize=4, weight_itemsize=2)
    assert [op for op, _, _ in ops] == ["ExpertMatMul", "ExpertMatMul", "ExpertSigmoid", "ExpertMul", "ExpertMul",
                                        "ExpertMatMul"]
    assert ops[0][1] == op_flops("MatMul", [None, None], [(n, h), (h, f)], [(n, f)], {}) == 2 * n * h * f
    assert ops[5][1] == op_flops("MatMul", [None, None], [(n, f), (f, h)], [(n, h)], {}) == 2 * n * f * h
    assert ops[0][2] == n * h * 4 + h * f * 2 + n * f * 4 and ops[5][2] == n * f * 4 + f * h * 2 + n * h * 4
    assert expert_ops([0, 0], h, f, 4, 4) == ()


@pytest.mark.parametrize("args, field", [(([1], 0, 7, 4, 4), "hidden=0"), (([1], 6, 7, 0, 4), "itemsize=0"),
                                         (([2, -1], 6, 7, 4, 4), r"rows_per_slot=\[2, -1\]")])
def test_expert_ops_refuse_bad_sizes_naming_them(args, field):
    from mindspore_hyper.moe.expert_ops import expert_ops

    with pytest.raises(ValueError, match=f"expert_ops: .*{field}.*expected"):
        expert_ops(*args)
