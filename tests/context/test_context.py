"""Context flags: defaults, validation, environment variables, reset."""
import pytest

import mindspore_hyper as mh
from mindspore_hyper.context import FLAGS, parse_bytes



def test_defaults():
    ctx = mh.get_context()
    assert ctx["mode"] == "simulation"  # CPU machine
    assert ctx["device_num"] == 8
    assert ctx["cache_block_size"] == 128 << 20
    assert ctx["prefetch_depth"] == 4
    assert ctx["offload_worker_nice"] == 19
    assert ctx["comm_aggregation_bytes"] == 4 << 20
    assert ctx["hyper_offload"] is False and ctx["hyper_mpmd"] is False
    assert set(ctx) == set(FLAGS)


def test_set_get_reset():
    mh.set_context(mode="native", device_num=16, device_memory="512MiB", hyper_offload=True,
                   cache_block_size="1GiB", topology="supernode384")
    assert mh.get_context("mode") == "native"
    assert mh.get_context("device_num") == 16
    assert mh.get_context("device_memory") == 512 << 20
    assert mh.get_context("cache_block_size") == 1 << 30
    assert mh.get_context("hyper_offload") is True
    mh.reset_context()
    assert mh.get_context("device_num") == 8


@pytest.mark.parametrize("flag,value,expected", [
    ("mode", "auto", "simulation"),
    ("device_num", 0, "device_num"),
    ("device_num", 2.5, "device_num"),
    ("device_memory", "64 parsecs", "64 parsecs"),
    ("device_memory", -1, ">= 0"),
    ("cache_block_size", "512KiB", "between 1MiB and 1GiB"),
    ("cache_block_size", "2GiB", "between 1MiB and 1GiB"),
    ("cache_block_size", "1MB", "between 1MiB and 1GiB"),  # decimal: 10^6 bytes, under 1 MiB
    ("prefetch_depth", 0, "[1, 64]"),
    ("offload_worker_nice", 20, "[0, 19]"),
    ("hyper_offload", "maybe", "bool"),
    ("comm_aggregation_bytes", "1B", "between"),
    ("topology", "torus9000", "preset"),
    ("topology", "/nonexistent/topo.yaml", "does not exist"),
    ("memory_check", "ignore", "'warn'"),
    ("sim_collectives", "nccl", "'mindspore', 'library'"),
    ("host_memory", "lots", "byte size"),
    ("offload_dir", 3, "directory path"),
])
def test_bad_values_name_flag_and_allowed(flag, value, expected):
    with pytest.raises(ValueError) as err:
        mh.set_context(**{flag: value})
    assert flag in str(err.value) and repr(value) in str(err.value) and expected in str(err.value)


def test_bad_value_applies_nothing():
    with pytest.raises(ValueError):
        mh.set_context(device_num=4, prefetch_depth=0)
    assert mh.get_context("device_num") == 8


def test_unknown_flag():
    with pytest.raises(ValueError, match="unknown context flag 'device_count'"):
        mh.set_context(device_count=8)
    with pytest.raises(ValueError, match="unknown context flag"):
        mh.get_context("nope")


def test_environment_variables(monkeypatch):
    monkeypatch.setenv("MS_HYPER_DEVICE_NUM", "4")
    monkeypatch.setenv("MS_HYPER_HYPER_OFFLOAD", "1")
    monkeypatch.setenv("MS_HYPER_DEVICE_MEMORY", "2GiB")
    assert mh.get_context("device_num") == 4
    assert mh.get_context("hyper_offload") is True
    assert mh.get_context("device_memory") == 2 << 30
    mh.set_context(device_num=2)  # explicit beats environment
    assert mh.get_context("device_num") == 2
    monkeypatch.setenv("MS_HYPER_PREFETCH_DEPTH", "lots")
    with pytest.raises(ValueError, match="MS_HYPER_PREFETCH_DEPTH"):
        mh.get_context("prefetch_depth")


def test_topology_yaml_path(tmp_path):
    path = tmp_path / "topo.yaml"
    path.write_text("devices: 2\n")
    mh.set_context(topology=str(path))
    assert mh.get_context("topology") == str(path)


@pytest.mark.parametrize("text,n", [("512MiB", 512 << 20), ("64GiB", 64 << 30), ("4KiB", 4096),
                                    ("1.5KiB", 1536), (123, 123), ("77", 77), ("2 TiB", 2 << 40),
                                    # decimal units mean what the SI says (issue 42: "64GB" meant 64 GiB)
                                    ("64GB", 64 * 10 ** 9), ("512MB", 512 * 10 ** 6), ("1.5KB", 1500),
                                    ("3TB", 3 * 10 ** 12)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


def test_device_memory_in_both_unit_families():
    mh.set_context(device_memory="64GiB")
    assert mh.get_context("device_memory") == 64 << 30
    mh.set_context(device_memory="64GB")
    assert mh.get_context("device_memory") == 64_000_000_000
    with pytest.raises(ValueError, match=r"device_memory='64 gigs': expected a byte size, an int or a string like "
                                         r"'64GiB', '512MiB', '4KiB' \(binary\) or '64GB' \(decimal, 10\^9 bytes\)"):
        mh.set_context(device_memory="64 gigs")


def test_parse_bytes_rejects_fraction_and_bool():
    with pytest.raises(ValueError, match="whole number"):
        parse_bytes("0.3B")
    with pytest.raises(ValueError, match="byte size"):
        parse_bytes(True)
