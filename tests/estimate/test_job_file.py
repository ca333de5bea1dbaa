"""Job YAML files: presets with overrides, sections, device_memory, and errors naming the key."""
import pytest

from mindspore_hyper.estimate import build_config, build_job, preset, read_job_file


def write(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def test_preset_with_overrides_and_strategy(tmp_path):
    spec = read_job_file(write(tmp_path, "model:\n  preset: llama2-7b\n  micro_batch: 2\n"
                                         "strategy:\n  data: 8\n  zero_stage: 1\ndevice_memory: 64GiB\n"))
    config, strategy = build_job(spec)
    assert config == preset("llama2-7b").with_(micro_batch=2)
    assert (strategy.data, strategy.zero_stage) == (8, 1)
    assert spec["device_memory"] == 64 * 2**30


def test_explicit_model_without_preset():
    c = build_config({"layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 16, "dtype_bytes": 4})
    assert c == preset("gpt-example").with_(micro_batch=1)


@pytest.mark.parametrize("text, match", [
    ("model: {layers: 2}\nstrateg: {}\n", "strateg: unknown key; expected one of model, strategy, device_memory"),
    ("model: [1, 2]\n", "model: expected a mapping, got list"),
    ("model: {preset: gpt-example, depth: 3}\n", "model.depth: unknown key"),
    ("model: {preset: gpt-example}\nstrategy: {data: 2, zero: 1}\n", "strategy.zero: unknown key"),
    ("device_memory: lots\n", "device_memory='lots': expected a byte size"),
    ("model: {a: [}\n", "not valid YAML"),
])
def test_errors_name_the_key(tmp_path, text, match):
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=match):
        build_job(read_job_file(path))


def test_missing_required_fields():
    with pytest.raises(ValueError, match="give layers, hidden, heads, vocab and seq_len, or a preset"):
        build_config({"layers": 2})
    with pytest.raises(ValueError, match="unknown model preset 'gpt5'"):
        build_config({"preset": "gpt5"})
