"""The `cpu` profile: measured in this process (numpy kernels, tiny sizes), written and read back
as a hardware file, and usable by the step-time model; bad arguments are named."""
import pytest

from mindspore_hyper.estimate import JobStrategy, TransformerConfig, estimate_step_time, load_hardware
from mindspore_hyper.estimate.calibrate import calibrate_cpu, save_hardware


def test_profile_round_trip_and_step_time(tmp_path):
    hw = calibrate_cpu(processes=1, threads=1, backend="numpy", size=64, seconds=0.01)
    assert hw.name == "cpu" and hw.attention == "materialized"
    assert hw.peak_flops > 1e6 and hw.memory_bandwidth > 1e6 and hw.levels[0].bandwidth > 1e6
    assert 0 < hw.levels[0].latency < 1.0 and 0 < hw.efficiency.op_overhead < 1.0
    assert "measured by calibrate_cpu(1 processes x 1 threads, numpy)" in hw.sources["peak_tflops"]
    back = load_hardware(save_hardware(hw, str(tmp_path / "cpu.yaml")))
    assert back.peak_flops == pytest.approx(hw.peak_flops) and back.levels[0].latency == pytest.approx(
        hw.levels[0].latency)
    assert back.efficiency.op_overhead == pytest.approx(hw.efficiency.op_overhead)
    config = TransformerConfig(layers=2, hidden=64, heads=4, vocab=128, seq_len=16, micro_batch=4, dtype_bytes=4)
    one = estimate_step_time(config.with_(micro_batch=8), JobStrategy(microbatches=1), back)
    four = estimate_step_time(config, JobStrategy(data=2, tensor=2, microbatches=1), back)
    assert four.comm and one.seconds > 0 and four.seconds > 0
    # every op pays the measured launch overhead at least once forward
    assert one.layer.forward >= len(one.layer.ops) * hw.efficiency.op_overhead


@pytest.mark.parametrize("kwargs, message", [({"processes": 0}, "processes=0"), ({"backend": "jax"}, "backend='jax'"),
                                             ({"seconds": 0}, "seconds=0")])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        calibrate_cpu(**kwargs)
