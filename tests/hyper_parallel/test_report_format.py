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
