"""The text of `mindspore-hyper run`/`dryrun` reports (issue 42: a small model's predicted step
printed as "0.000 s"; a dense model's dry run said "MoE routing balanced" as if it had routers)."""
from mindspore_hyper.hyper_parallel.report import format_report
from mindspore_hyper.units import format_seconds


def test_seconds_keep_three_significant_digits_at_any_scale():
    assert format_seconds(0.0) == "0.000 s"
    assert format_seconds(2.5) == "2.500 s"
    assert format_seconds(0.0547) == "54.7 ms"
    assert format_seconds(3.21e-5) == "32.1 us"  # was "0.000 s"


def _report(moe_routing):
    mesh = {"shape": [4], "dim_names": ["tp"], "ranks": [0, 1, 2, 3], "source": "HyperParallel API",
            "parameter_bytes_per_device": 1024, "peak_bytes_per_device": 512, "peak_op": "MatMul", "ops": 3,
            "collectives": [], "replicated_fallbacks": {},
            "predicted": {"hardware": "ascend-910c", "step_seconds": 4.2e-5, "compute_seconds": 1.2e-5,
                          "comm_seconds": 3.0e-5, "overlapped_seconds": 3.0e-5}}
    return {"mode": "dryrun", "devices": 4, "meshes": [mesh], "moe_routing": moe_routing}


def test_predicted_step_and_routing_lines():
    text = format_report(_report("balanced: token t's j-th copy to expert (t k + j) mod E"))
    assert "predicted step on ascend-910c: 42 us without overlap (12 us compute, 30 us collectives; " \
           "30 us if fully overlapped)" in text
    assert text.splitlines()[0] == ("mindspore-hyper: dryrun, 4 devices; MoE routers (if the model has any) route "
                                    "balanced: token t's j-th copy to expert (t k + j) mod E")
    assert "MoE" not in format_report(_report("learned"))


def test_equal_devices_print_as_one_line_with_their_ranges():
    """Issue 42: 4 devices with the same step peak printed 4 equal lines (grouping began above 16)."""
    from mindspore_hyper.runtime.report import device_groups

    same = {"step_peak": 2048, "step_peak_rounded": 2560, "step_peak_with_fragmentation": 2560}
    other = dict(same, step_peak=4096)
    rows = {0: same, 1: same, 2: other, 3: other, 4: same, 5: same, 6: dict(same, step_peak=1)}
    groups = device_groups(rows)
    assert groups == [("0-1,4-5 (4)", same), ("2-3 (2)", other), ("6", rows[6])]
    mesh = dict(_report("learned")["meshes"][0], memory_per_device=[],
                step_memory={"peak_phase": "backward", "peak_op": "MatMul", "alignment_bytes": 512,
                             "fragmentation": 0.0,
                             "per_device": [{"devices": label, **row} for label, row in groups]})
    text = format_report({"mode": "simulation", "devices": 7, "meshes": [mesh]})
    peaks = [line.strip() for line in text.splitlines() if "step peak" in line]
    assert peaks == ["devices 0-1,4-5 (4): step peak (forward, backward, update) 2.00 KiB in the backward of "
                     "MatMul; 2.50 KiB with blocks rounded to 512 bytes, 2.50 KiB with 0% fragmentation",
                     "devices 2-3 (2): step peak (forward, backward, update) 4.00 KiB in the backward of MatMul; "
                     "2.50 KiB with blocks rounded to 512 bytes, 2.50 KiB with 0% fragmentation",
                     "device 6: step peak (forward, backward, update) 1 B in the backward of MatMul; 2.50 KiB with "
                     "blocks rounded to 512 bytes, 2.50 KiB with 0% fragmentation"]
