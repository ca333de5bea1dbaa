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
