"""Hardware presets as data: every preset loads with its figures' sources; bad files name the field."""
import pytest
import yaml

from mindspore_hyper.estimate import hardware_presets, load_hardware
from mindspore_hyper.estimate.hardware import HARDWARE_DIR, hardware_from_dict

GOOD = {"name": "x", "peak_tflops": 100, "memory_GB": 16, "memory_bandwidth_GBps": 1000,
        "levels": [{"name": "node", "devices": 4, "bandwidth_GBps": 100, "latency_us": 1},
                   {"name": "net", "devices": 64, "bandwidth_GBps": 10, "latency_us": 5}],
        "efficiency": {"matmul": 0.8, "memory": 0.8, "network": 0.8, "message_overhead_us": 5}}


def test_presets_load_with_sources_for_every_figure():
    names = hardware_presets()
    assert {"a100-80gb", "h100-80gb", "h200", "ascend-910b", "ascend-910c"} <= set(names)
    for name in names:
        hw = load_hardware(name)
        for figure in ("peak_tflops", "memory_GB", "memory_bandwidth_GBps", "efficiency", "latency_us"):
            assert hw.sources.get(figure), (name, figure)
        for level in hw.levels:
            assert hw.sources.get(f"levels.{level.name}"), (name, level.name)


def test_a100_figures_in_si_units():
    hw = load_hardware("a100-80gb")
    assert hw.peak_flops == 312e12 and hw.memory_bytes == 80 * 10**9 and hw.memory_bandwidth == 2039e9
    assert [(lv.name, lv.devices, lv.bandwidth) for lv in hw.levels] == [("nvlink", 8, 300e9),
                                                                          ("infiniband", 4480, 25e9)]
    assert hw.levels[0].latency == pytest.approx(1e-6) and hw.efficiency.message_overhead == pytest.approx(1.25e-6)
    assert hw.attention == "materialized"


def test_supernode_preset_is_the_designs_384_npu_domain():
    hw = load_hardware("ascend-910c")
    assert hw.levels[0].devices == 384 and hw.levels[0].latency == pytest.approx(200e-9)


def test_file_path_and_dict(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    assert load_hardware(str(path)).peak_flops == 100e12
    assert load_hardware(GOOD).max_devices == 64


@pytest.mark.parametrize("change, message", [
    ({"peak_tflops": -1}, "field 'peak_tflops': expected a number > 0"),
    ({"peak_tflops": None}, "field 'peak_tflops'"),
    ({"bogus": 1}, "field bogus: unknown"),
    ({"attention": "fast"}, "field 'attention': expected one of flash, materialized"),
    ({"levels": []}, "field 'levels': expected a non-empty list"),
    ({"levels": [{"name": "a", "devices": 8, "bandwidth_GBps": 1, "latency_us": 1},
                 {"name": "b", "devices": 12, "bandwidth_GBps": 1, "latency_us": 1}]},
     "field 'levels[1].devices': 12 must be a multiple of and larger than the level below (8)"),
    ({"levels": [{"name": "a", "devices": 8, "bandwidth_GBps": 0, "latency_us": 1}]},
     "field 'levels[0].bandwidth_GBps'"),
    ({"levels": [{"name": "a", "devices": 8, "latency_us": 1}]}, "field levels[0].bandwidth_GBps: missing"),
    ({"efficiency": {"matmul": 1.5, "memory": 0.8, "network": 0.8, "message_overhead_us": 0}},
     "field 'efficiency.matmul': expected a number > 0 and <= 1"),
    ({"efficiency": {"matmul": 1, "memory": 0.8, "network": 0.8, "message_overhead_us": 0, "peer_wait_us": -1}},
     "field 'efficiency.peer_wait_us'"),
])
def test_bad_fields_are_named(change, message):
    with pytest.raises(ValueError, match="hardware '<dict>'") as info:
        hardware_from_dict({**GOOD, **change})
    assert message in str(info.value)


def test_missing_field_and_unknown_preset():
    bad = dict(GOOD)
    del bad["memory_GB"]
    with pytest.raises(ValueError, match="field memory_GB: missing"):
        hardware_from_dict(bad)
    with pytest.raises(ValueError, match="unknown preset; expected one of .*a100-80gb"):
        load_hardware("a101")
    with pytest.raises(ValueError, match="cannot read"):
        load_hardware(HARDWARE_DIR + "/nothing.yaml")
