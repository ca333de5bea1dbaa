"""`mindspore-hyper dryrun`: a training script on many devices, its report in `run`'s schema,
and the predicted step time computed from what the step recorded."""
import json
import math
import os
import subprocess
import sys

import pytest

from paths import EXAMPLES

CLI = os.path.join(os.path.dirname(sys.executable), "mindspore-hyper")
SCRIPT = os.path.join(EXAMPLES, "dryrun_llm.py")


def _cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)


def test_a_large_job_dry_runs_with_the_report_of_run(tmp_path):
    """A ~6B-parameter job on 512 devices (far beyond this machine's memory in values) runs;
    its JSON has the keys `mindspore-hyper run --json` writes for the same script."""
    args = ["--layers", "4", "--hidden", "4096", "--heads", "32", "--seq", "2048", "--vocab", "32000",
            "--data", "64", "--tensor", "8"]
    done = _cli("dryrun", "--devices", "512", "--hardware", "a100-80gb", "--fragmentation", "0.1", "--json",
                str(tmp_path / "d.json"), "--plot", str(tmp_path / "d.png"), SCRIPT, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mindspore-hyper: dryrun, 512 devices" in done.stdout
    dry = json.loads((tmp_path / "d.json").read_text())
    assert dry["moe_routing"].startswith("balanced")  # the assumption a dry run makes, said in its report
    mesh = dry["meshes"][0]
    assert mesh["shape"] == [64, 8] and mesh["training_step"]
    assert (tmp_path / "d.png").stat().st_size > 0
    assert len(mesh["memory_timeline"]) == mesh["ops"] and mesh["peak_op"]
    assert max(live for _, live in mesh["memory_timeline"]) <= mesh["peak_bytes_per_device"]
    (row,) = mesh["memory_per_device"]  # every device runs the same program
    assert row["devices"].endswith("(512)")
    hidden, ffn, vocab, layers = 4096, 4 * 4096, 32000, 4
    split = 3 * hidden * hidden + 3 * hidden + hidden * hidden + 2 * hidden * ffn + ffn  # qkv, proj.w, fc1, fc2.w
    whole = 2 * hidden + 4 * hidden  # proj and fc2 biases, two LayerNorms
    params = layers * (split / 8 + whole) + vocab * hidden / 8 + 2048 * hidden + 2 * hidden + hidden * vocab / 8
    assert row["parameters"] == 4 * params  # float32, Megatron's split
    step = mesh["step_memory"]  # forward, backward and update; the preset's rounding, --fragmentation
    assert [row[0] for row in step["timeline"]].count("backward") == mesh["ops"] and step["peak_phase"]
    assert step["alignment_bytes"] == 512 and step["fragmentation"] == 0.1
    (peaks,) = step["per_device"]
    assert peaks["devices"].endswith("(512)")
    states = row["parameters"] + row["optimizer_states"]
    assert peaks["step_peak"] == states + max(a + g for _, _, a, g in step["timeline"])
    assert peaks["step_peak"] <= peaks["step_peak_rounded"] < peaks["step_peak_with_fragmentation"]
    assert "step peak (forward, backward, update)" in done.stdout
    predicted = mesh["predicted"]
    assert predicted["hardware"] == "a100-80gb" and predicted["step_seconds"] > predicted["overlapped_seconds"] > 0
    run = _cli("run", "--devices", "4", "--json", str(tmp_path / "r.json"), SCRIPT)
    assert run.returncode == 0, run.stderr[-3000:]
    simulated = json.loads((tmp_path / "r.json").read_text())
    assert simulated["moe_routing"] == "learned"
    assert set(simulated) == set(dry) and set(simulated["meshes"][0]) == set(mesh) - {"predicted"}


def test_each_program_of_its_own_gets_its_own_predicted_step(pynative):
    """A device program of its own (an expert member under a routing histogram: `programs` of a
    mesh entry) is timed on its own ops and collectives, as `predict_step` times a mesh: the same
    compute, and twice the all-to-all bytes take longer; the mesh's prediction is the slowest
    program's (the step waits for it), whichever it is."""
    from mindspore_hyper.cli.dryrun import add_predictions
    from mindspore_hyper.estimate.dryrun_time import predict_step
    from mindspore_hyper.estimate.hardware import load_hardware

    hw = load_hardware("a100-80gb")

    def a2a(nbytes):
        return [{"kind": "AllToAll", "axis": "expert", "phase": "forward", "count": 1,
                 "send_bytes_per_device": nbytes, "input_bytes_per_device": nbytes}]

    compute = [{"op": "MatMul", "flops": 10 ** 9, "bytes": 10 ** 6, "calls": 1}]
    mesh = {"shape": [4], "dim_names": ["expert"], "training_step": True, "compute": compute,
            "collectives": a2a(10 ** 8),
            "programs": [{"devices": "1", "compute": compute, "collectives": a2a(2 * 10 ** 8)}]}
    add_predictions({"meshes": [mesh]}, hw)
    own = mesh["programs"][0]["predicted"]
    representative = predict_step(mesh, hw).to_dict()
    assert own == predict_step(dict(mesh, collectives=a2a(2 * 10 ** 8)), hw).to_dict()
    assert own["compute_seconds"] == representative["compute_seconds"]
    assert own["comm_seconds"] > representative["comm_seconds"]
    slowest = mesh["predicted"]
    assert slowest["slowest_devices"] == "1" and slowest["step_seconds"] == own["step_seconds"]
    assert "the slowest of the mesh's 2 device programs: devices 1" in slowest["notes"][-1]
    # the representative slowest: device 1 with half the all-to-all bytes
    mesh["programs"][0]["collectives"] = a2a(5 * 10 ** 7)
    add_predictions({"meshes": [mesh]}, hw)
    assert mesh["predicted"]["slowest_devices"] is None
    assert mesh["predicted"]["step_seconds"] == representative["step_seconds"] > mesh["programs"][0]["predicted"][
        "step_seconds"]


def test_a_pipeline_stage_is_timed_by_its_slowest_program(pynative):
    """A pipeline stage with device programs of their own (its expert members under a routing
    histogram: `programs` of a stage) costs its slowest program's ops: a heavier program sets the
    stage's cost, as if it were the stage's own rows; a lighter one changes nothing."""
    from mindspore_hyper.estimate.dryrun_time import predict_pipeline_step
    from mindspore_hyper.estimate.hardware import load_hardware

    hw = load_hardware("a100-80gb")

    def matmul(flops):
        return [{"op": "ExpertMatMul", "flops": flops, "bytes": 10 ** 6, "calls": 1}]

    def mesh(stage0, programs=()):
        stage = {"compute": stage0, "collectives": []}
        if programs:
            stage["programs"] = [{"devices": "1", "compute": c, "collectives": []} for c in programs]
        return {"shape": [2, 2], "dim_names": ["pipeline", "expert"],
                "pipeline": {"schedule": "1f1b", "stages": 2, "microbatches": 2, "chunks": 1, "axis": "pipeline",
                             "data_axis": None, "p2p": {},
                             "per_stage": {"0": stage, "1": {"compute": matmul(10 ** 12), "collectives": []}}}}

    plain = predict_pipeline_step(mesh(matmul(10 ** 12)), hw)
    heavier = predict_pipeline_step(mesh(matmul(10 ** 12), [matmul(4 * 10 ** 12)]), hw)
    assert heavier.to_dict() == predict_pipeline_step(mesh(matmul(4 * 10 ** 12)), hw).to_dict()
    assert heavier.compute_seconds > plain.compute_seconds
    assert predict_pipeline_step(mesh(matmul(10 ** 12), [matmul(10 ** 11)]), hw).to_dict() == plain.to_dict()


def test_a_pipeline_prediction_counts_one_device_flops(pynative):
    """`flops_per_device` of a pipeline is one device's: the stages of its own pipeline rank
    (forward, recompute, backward: 3 x the forward per microbatch), the busiest rank's; not
    every stage's summed. Counted by hand: 1F1B over 2 ranks, 4 microbatches, stage forwards of
    1e12 and 3e12 FLOPs: 3 x 4 x 3e12; interleaved over 2 ranks x 2 chunks (virtual stages 0, 2
    on rank 0, 1, 3 on rank 1), forwards 1, 2, 3, 5 (x 1e12): rank 1's 3 x 4 x (2 + 5) x 1e12."""
    from mindspore_hyper.estimate.dryrun_time import predict_pipeline_step
    from mindspore_hyper.estimate.hardware import load_hardware

    def mesh(schedule, chunks, forwards):
        per_stage = {str(s): {"compute": [{"op": "MatMul", "flops": f, "bytes": 10 ** 6, "calls": 1}],
                              "collectives": []} for s, f in enumerate(forwards)}
        return {"shape": [2, 2], "dim_names": ["pipeline", "data"],
                "pipeline": {"schedule": schedule, "stages": 2, "microbatches": 4, "chunks": chunks,
                             "axis": "pipeline", "data_axis": "data", "p2p": {}, "per_stage": per_stage}}

    hw = load_hardware("a100-80gb")
    p = predict_pipeline_step(mesh("1f1b", 1, [10 ** 12, 3 * 10 ** 12]), hw)
    assert p.to_dict()["flops_per_device"] == 3 * 4 * 3 * 10 ** 12
    p = predict_pipeline_step(mesh("interleaved_1f1b", 2, [10 ** 12, 2 * 10 ** 12, 3 * 10 ** 12, 5 * 10 ** 12]), hw)
    assert p.flops == 3 * 4 * (2 + 5) * 10 ** 12


def test_gradient_sums_on_any_axis_are_timed_once_per_step(pynative):
    """A backward collective caused only by gradient syncs (the non-expert parameters' sums over
    the expert axis, which also splits tokens) runs once per step after the schedule, like the
    data axis's: it adds one collective's time to comm_seconds and nothing to the schedule; the
    same row caused by an op (the MoE combine's backward) is paid in every microbatch's backward."""
    from mindspore_hyper.estimate.collective_time import collective_seconds, group_fanouts
    from mindspore_hyper.estimate.dryrun_time import predict_pipeline_step
    from mindspore_hyper.estimate.hardware import load_hardware

    def mesh(cause=None):
        rows = [] if cause is None else [{"kind": "AllReduce", "axis": "expert", "phase": "backward", "count": 1,
                                          "send_bytes_per_device": 0, "input_bytes_per_device": 10 ** 9,
                                          "causes": {cause: 1}}]
        stage = {"compute": [{"op": "MatMul", "flops": 10 ** 12, "bytes": 10 ** 6, "calls": 1}], "collectives": rows}
        return {"shape": [2, 2, 2], "dim_names": ["data", "pipeline", "expert"],
                "pipeline": {"schedule": "1f1b", "stages": 2, "microbatches": 4, "chunks": 1, "axis": "pipeline",
                             "data_axis": "data", "p2p": {}, "per_stage": {"0": stage, "1": stage}}}

    hw = load_hardware("a100-80gb")
    one = collective_seconds("all_reduce", 10 ** 9, hw, group_fanouts(hw, 2, 1))
    plain = predict_pipeline_step(mesh(), hw)
    synced = predict_pipeline_step(mesh("grad sync of blocks.0.attn.o.weight"), hw)
    assert synced.compute_seconds == pytest.approx(plain.compute_seconds, rel=1e-12)
    assert synced.comm_seconds == pytest.approx(plain.comm_seconds + one, rel=1e-12)
    by_op = predict_pipeline_step(mesh("MoE dispatch/combine (token rows)"), hw)
    assert by_op.compute_seconds > plain.compute_seconds + 4 * one / 2  # in each of 4 microbatches' backwards
    assert by_op.comm_seconds == pytest.approx(plain.comm_seconds, rel=1e-12)


def test_predicted_step_time_from_the_recorded_ops(pynative):
    from mindspore_hyper.estimate.dryrun_time import predict_step
    from mindspore_hyper.estimate.hardware import load_hardware

    hw = load_hardware("a100-80gb")
    mesh = {"shape": [2, 4], "dim_names": ["data", "tensor"],
            "compute": [{"op": "MatMul", "flops": 2 * 10 ** 12, "bytes": 10 ** 6, "calls": 3},
                        {"op": "AddExt", "flops": 10 ** 6, "bytes": 4 * 10 ** 9, "calls": 2}],
            "collectives": [{"kind": "AllReduce", "axis": "tensor", "phase": "forward", "count": 2,
                             "send_bytes_per_device": 0, "input_bytes_per_device": 2 * 10 ** 8}]}
    p = predict_step(mesh, hw, training=True)
    eff = hw.efficiency
    compute = 3 * 3 * (2e12 / (hw.peak_flops * eff.matmul) + eff.op_overhead) + \
        3 * 2 * (4e9 / (hw.memory_bandwidth * eff.memory) + eff.op_overhead)
    assert p.compute_seconds == pytest.approx(compute, rel=1e-12)
    from mindspore_hyper.estimate.collective_time import collective_seconds, group_fanouts

    assert p.comm_seconds == pytest.approx(2 * collective_seconds("all_reduce", 1e8, hw, group_fanouts(hw, 4, 1)))
    assert p.flops == 3 * (3 * 2e12 + 2 * 1e6)
    assert any("GEMM tile and wave quantisation (gemm_tiling) not applied" in n for n in p.notes)  # said, not silent
    assert math.isclose(p.step_seconds, p.compute_seconds + p.comm_seconds)


def test_bad_input_is_named(tmp_path):
    done = _cli("dryrun", "--hardware", "no-such-gpu", SCRIPT)
    assert done.returncode != 0 and "no-such-gpu" in done.stderr
    done = _cli("dryrun", str(tmp_path / "missing.py"))
    assert done.returncode != 0 and "missing.py" in done.stderr
    done = _cli("dryrun", "--fragmentation", "2", SCRIPT)
    assert done.returncode != 0 and "--fragmentation 2: expected a fraction in [0, 1]" in done.stderr


def test_a_hyper_parallel_script_dry_runs_like_its_simulation(tmp_path):
    """The same HyperParallel-API script under `run` (values) and `dryrun` (shapes): its mesh's
    laid-out parameters, peak, ops' FLOPs and bytes, collectives and step memory series agree
    exactly; the series' update point and step peak are checked by hand (Adam: 2 states per
    parameter element)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hp_tp_script.py")
    reports = {}
    for command in ("run", "dryrun"):
        done = _cli(command, "--devices", "4", "--json", str(tmp_path / f"{command}.json"), script)
        assert done.returncode == 0, done.stderr[-3000:]
        reports[command] = json.loads((tmp_path / f"{command}.json").read_text())
    (sim,), (dry,) = reports["run"]["meshes"], reports["dryrun"]["meshes"]
    for key in ("parameter_bytes_per_device", "peak_bytes_per_device", "collectives", "compute", "ops",
                "step_memory"):
        assert sim[key] == dry[key], key
    assert any(c["kind"] == "AllReduce" for c in dry["collectives"])
    # the step's phases, marked from the script's value_and_grad and optimizer call
    # (hyper_parallel/step_phases.py): its 5 forward ops, their backwards, the update
    step = dry["step_memory"]
    assert [row[:2] for row in step["timeline"]] == [["forward", op] for op in FORWARD] + \
        [["backward", op] for op in reversed(FORWARD)] + [["optimizer", "update"]]
    # tp=4: up (64, 16) column-parallel and its bias 64 -> 16 x 16 + 16 floats, down (16, 64)
    # row-parallel 16 x 16 floats with its bias 16 replicated: 4 bytes each
    params = 4 * (16 * 16 + 16 + 16 * 16 + 16)
    assert dry["parameter_bytes_per_device"] == params
    assert step["timeline"][-1] == ["optimizer", "update", 0, params]  # every gradient alive, no activation
    peak = max(row[2] + row[3] for row in step["timeline"])
    assert step["optimizer"] == "Adam" and {row["step_peak"] for row in step["per_device"]} == {3 * params + peak}


FORWARD = ("MatMul", "BiasAdd", "ReLU", "MatMul", "BiasAdd")  # up, relu, down: nn.Dense is MatMul + BiasAdd


def test_a_pipelined_gpt_dry_runs_like_its_simulation(tmp_path):
    """The examples' GPT cut into 2 stages (1F1B, 4 microbatches) on data 2 x pipeline 2 x tensor 2:
    the memory rows, every stage's collectives and ops, the sends and the step's memory series per
    pipeline rank (pipeline/pipeline_step_memory.py) agree with `run`; the
    prediction simulates the schedule, and `run --hardware` predicts the same step from its own
    (numeric) simulation's report."""
    args = ["--pipeline", "2", "--layers", "4"]
    reports = {}
    for command in ("run", "dryrun"):
        done = _cli(command, "--devices", "8", "--json", str(tmp_path / f"{command}.json"), "--hardware",
                    "ascend-910c", SCRIPT, *args)
        assert done.returncode == 0, done.stderr[-3000:]
        reports[command] = json.loads((tmp_path / f"{command}.json").read_text())
    (sim,), (dry,) = reports["run"]["meshes"], reports["dryrun"]["meshes"]
    for key in ("memory_per_device", "collectives", "compute", "pipeline", "step_memory"):
        assert sim[key] == dry[key], key
    assert dry["pipeline"]["schedule"] == "1f1b" and set(dry["pipeline"]["per_stage"]) == {"0", "1"}
    # the global norm's float64 all-reduce over the 8 devices: 8 bytes in, the ring's 2(n-1)/n x 8 = 14 sent
    (norm,) = [row for row in dry["collectives"] if "grad norm" in row["causes"]]
    assert (norm["kind"], norm["count"], norm["send_bytes_per_device"], norm["input_bytes_per_device"]) == \
        ("AllReduce", 1, 14, 8) and "@stage" not in norm["axis"]
    assert set(dry["step_memory"]["per_pipeline_rank"]) == {"0", "1"} and dry["step_memory"]["timeline"]
    predicted = dry["predicted"]
    assert predicted["compute_seconds"] > 0 and "bubble" in predicted["notes"][0]
    assert sim["predicted"] == predicted


def test_run_refuses_a_prediction_under_msrun():
    done = subprocess.run([CLI, "run", "--processes", "2", "--hardware", "a100-80gb", SCRIPT],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--hardware: the prediction is made from the simulation's report" in done.stderr


def test_the_plot_draws_one_line_per_distinct_device_program(tmp_path):
    """A mesh whose expert members run programs of their own (a routing histogram) is drawn as one
    memory line per program: the representative devices', then each program's, from its own
    series (after a training step the step-memory series: activations + gradients per op)."""
    from mindspore_hyper.cli.report_plot import _program_series, plot_report

    gib = 2**30
    step = {"timeline": [["forward", "MatMul", gib, 0], ["backward", "MatMul", gib, gib]],
            "programs": [{"ranks": [1, 5], "timeline": [["forward", "MatMul", 2 * gib, 0]]},
                         {"ranks": [2], "timeline": [["forward", "MatMul", 3 * gib, gib]]}]}
    mesh = {"dim_names": ["expert"], "shape": [4], "source": "MoENet", "step_memory": step, "collectives": []}
    series = list(_program_series(mesh))
    assert [(label, live) for label, live, _ in series] == [("", [1.0, 2.0]), (", devices 1,5", [2.0]),
                                                            (", devices 2", [4.0])]
    forward_only = {"memory_timeline": [["MatMul", gib]],
                    "programs": [{"devices": "3", "memory_timeline": [["MatMul", 2 * gib]]}]}
    assert [(label, live) for label, live, _ in _program_series(forward_only)] == [("", [1.0]), (", devices 3", [2.0])]
    png = plot_report({"meshes": [mesh], "mode": "dryrun", "devices": 4}, str(tmp_path / "p.png"))
    assert os.path.getsize(png) > 0
