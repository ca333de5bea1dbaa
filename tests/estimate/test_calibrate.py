"""The `cpu` profile: measured in this process (numpy kernels, tiny sizes), written and read back
as a hardware file, and usable by the step-time model; bad arguments are named."""
import multiprocessing as mp
import os
import time

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
    assert back.efficiency.peer_wait == hw.efficiency.peer_wait == 0.0  # one process: no peers
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


def _wait_worker(group: str, rank: int, late: float, queue) -> None:
    from mindspore_hyper.estimate.transport_calibration import measure_all_reduce

    queue.put((rank, measure_all_reduce(group, rank, 2, 4096, repeats=5, compute=lambda: time.sleep(late * rank),
                                             rounds=3),
               measure_all_reduce(group + "-aligned", rank, 2, 4096, repeats=5)))


@pytest.mark.parametrize("kwargs, message", [({"repeats": 0}, "repeats=0"), ({"rounds": 0}, "rounds=0"),
                                             ({"message_bytes": 4}, "message_bytes=4")])
def test_bad_transport_measurement_arguments(kwargs, message):
    from mindspore_hyper.estimate.transport_calibration import measure_all_reduce

    args = {"name": "unused", "rank": 0, "size": 2, "message_bytes": 4096, **kwargs}
    with pytest.raises(ValueError, match=message):
        measure_all_reduce(**args)


def _aligned_call(alpha: float, bandwidth: float) -> float:
    """The aligned 4-byte call's seconds for 2 ranks, back from the ring formula's two figures."""
    return 2 * alpha + 4 / bandwidth


def test_peer_wait_measures_a_late_peer():
    """Rank 1 computes 40 ms before each unaligned call (3 rounds), rank 0 nothing: rank 0's call takes >= 40 ms
    and rank 1's >= 0, so the group's mean excess over the aligned calls is >= (40 ms - both aligned
    calls) / 2, less a few ms of scheduling skew between the ranks' returns; without `compute` no
    wait is measured."""
    from mindspore_hyper.comm.job_token import job_token

    job_token()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    group = f"peer-wait-{os.getpid()}-{time.time_ns()}"
    procs = [ctx.Process(target=_wait_worker, args=(group, r, 0.04, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, unaligned, aligned = queue.get(timeout=300)
        got[rank] = (unaligned, aligned)
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert got[0][0][2] == pytest.approx(got[1][0][2])  # one figure for the group
    aligned = sum(_aligned_call(*got[rank][0][:2]) for rank in (0, 1))
    assert got[0][0][2] >= (0.04 - aligned) / 2 - 5e-3
    assert got[0][1][2] == 0.0 and got[0][1][1] > 0 and got[0][1][0] >= 0
