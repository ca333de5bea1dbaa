"""`mindspore-hyper estimate` through the installed console script: results equal the library's,
YAML + flags, sweep + plot, JSON, and exit code 2 with a message naming the bad flag."""
from cli_run import cli, cli_json

from mindspore_hyper.estimate import JobStrategy, estimate_job, largest_fitting, preset


def test_json_equals_the_library_estimate():
    out = cli_json("estimate", "--preset", "gpt-example", "--data", "8", "--zero", "1", "--micro-batch", "1")
    expected = estimate_job(preset("gpt-example").with_(micro_batch=1), JobStrategy(data=8, zero_stage=1))
    assert out["stages"] == [s.to_dict() for s in expected.stages]
    assert out["stages"][0]["parameters"] == 117_504 * 4 and out["stages"][0]["optimizer_states"] == 117_504
    assert out["total_params"] == 117_504 and out["devices"] == 8 and out["fits"] is None


def test_text_output_and_fit_limits():
    code, out, err = cli("estimate", "--preset", "llama2-7b", "--data", "8", "--tensor", "4", "--zero", "1",
                         "--recompute", "selective", "--device-memory", "64GiB")
    assert code == 0, err
    assert "data 8 x tensor 4 x pipeline 1 = 32 devices" in out and "fits in 64.00 GiB" in out
    assert "Table 2 row 4" in out
    c, s = preset("llama2-7b"), JobStrategy(data=8, tensor=4, zero_stage=1, recompute="selective")
    assert f"largest micro-batch that fits 64.00 GiB: {largest_fitting(c, s, 64 << 30)} (at seq 4096)" in out
    assert f"longest sequence: {largest_fitting(c, s, 64 << 30, 'seq_len')} (at micro-batch 1)" in out


def test_config_file_with_flags_overriding_it(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model:\n  preset: llama2-7b\n  micro_batch: 4\nstrategy:\n  data: 8\n  pipeline: 4\n"
                   "device_memory: 80GiB\n")
    out = cli_json("estimate", "--config", str(job), "--pipeline", "2", "--in-flight", "3")
    assert out["config"]["micro_batch"] == 4 and out["strategy"]["pipeline"] == 2
    assert [s["in_flight"] for s in out["stages"]] == [3, 3] and out["device_memory"] == 80 << 30
    expected = estimate_job(preset("llama2-7b").with_(micro_batch=4), JobStrategy(data=8, pipeline=2, in_flight=3))
    assert [s["total"] for s in out["stages"]] == [s.total for s in expected.stages]


def test_sweep_and_plot(tmp_path):
    png = tmp_path / "sweep.png"
    out = cli_json("estimate", "--preset", "llama2-7b", "--micro-batch", "2", "--inference", "--sweep",
                   "--plot", str(png))
    assert [r["seq_len"] for r in out["sweep"]] == [4096 << i for i in range(6)]
    assert out["sweep"][0]["kv_cache"] == 4_294_967_296 and out["sweep"][-1]["kv_cache"] == 32 * 4_294_967_296
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, text, _ = cli("estimate", "--preset", "gpt-example", "--sweep", "16,32,64")
    assert code == 0 and "seq      64:" in text


def test_help_has_examples():
    code, out, _ = cli("estimate", "--help")
    assert code == 0 and "examples:" in out and "--device-memory SIZE" in out and "--preset" in out


def check_usage_error(args, *fragments):
    code, out, err = cli(*args)
    assert code == 2, (code, out, err)
    for fragment in fragments:
        assert fragment in err, err


def test_bad_flag_values_exit_2_naming_the_flag():
    check_usage_error(["estimate", "--preset", "llama2-7b", "--tensor", "x"],
                      "argument --tensor: expected an int >= 1, got 'x'")
    check_usage_error(["estimate", "--preset", "llama2-7b", "--zero", "5"], "argument --zero: invalid choice: 5")
    check_usage_error(["estimate", "--preset", "llama2-7b", "--device-memory", "lots"],
                      "argument --device-memory: expected a byte size such as 512MiB")
    check_usage_error(["estimate", "--preset", "llama2-7b", "--sweep", "4K:1K"], "argument --sweep: expected")


def test_inconsistent_or_missing_input_exits_2():
    check_usage_error(["estimate", "--preset", "llama2-7b", "--tensor", "3"],
                      "mindspore-hyper estimate: error: --tensor 3: the attention heads (32) must divide")
    check_usage_error(["estimate", "--layers", "2"], "no model: give --preset NAME", "--hidden")
    check_usage_error(["estimate", "--preset", "gpt-example", "--plot", "x.png"], "--plot draws the sequence sweep")
    check_usage_error(["estimate", "--preset", "gpt-example", "--data", "4", "--expert", "3"],
                      "--expert 3: the expert-parallel size must divide data=4")
    check_usage_error(["estimate", "--config", "/nonexistent/job.yaml"], "No such file")


def test_bad_config_file_key_exits_2(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model:\n  preset: gpt-example\n  depth: 3\n")
    check_usage_error(["estimate", "--config", str(job)], "model.depth: unknown key")


def test_grad_sync_overlap_flag_acts_on_the_step_time():
    """--no-grad-sync-overlap gives the library's grad_sync_overlap=False step (the sync after the
    backward, nothing hidden), which is slower than the default's when the sync has backward to hide behind."""
    from mindspore_hyper.estimate import estimate_step_time

    args = ("estimate", "--preset", "gpt3-175b", "--data", "8", "--tensor", "8", "--pipeline", "8",
            "--microbatches", "16", "--micro-batch", "1", "--hardware", "a100-80gb")
    config = preset("gpt3-175b").with_(micro_batch=1)
    strategy = JobStrategy(data=8, tensor=8, pipeline=8, microbatches=16)
    default = cli_json(*args)["step_time"]
    local = cli_json(*args, "--no-grad-sync-overlap")["step_time"]
    assert cli_json(*args, "--grad-sync-overlap")["step_time"] == default
    assert default["seconds"] == estimate_step_time(config, strategy, "a100-80gb").seconds
    assert local["seconds"] == estimate_step_time(config, strategy.with_(grad_sync_overlap=False), "a100-80gb").seconds
    sync = [c for c in local["comm"] if c["axis"] == "data"]
    assert sync and all(c["hidden"] == 0.0 for c in sync)
    assert local["seconds"] > default["seconds"]


def test_grad_sync_overlap_flag_without_hardware_is_refused():
    check_usage_error(["estimate", "--preset", "gpt-example", "--no-grad-sync-overlap"],
                      "--grad-sync-overlap / --no-grad-sync-overlap changes only the step time: add --hardware")
