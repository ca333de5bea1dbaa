"""bench_step_time's pipeline row: its job as the planner describes it, and its prediction path
(calibration with the job's kernels, then estimate_step_time) on a tiny GPT; no msrun, no
wall-clock assertions."""
import sys
from types import SimpleNamespace

import pytest

from paths import REPO_ROOT

from mindspore_hyper.estimate import estimate_step_time

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import bench_step_time  # noqa: E402

ARGS = SimpleNamespace(layers=4, hidden=32, heads=2, seq=8, vocab=64, batch=8, microbatches=4, schedule="1f1b")


def test_pipeline_job_is_the_runtime_the_planner_describes():
    config, strategy = bench_step_time.pipeline_job(ARGS)
    assert (config.layers, config.hidden, config.heads, config.seq_len, config.vocab) == (4, 32, 2, 8, 64)
    assert config.micro_batch == 2 and config.dtype_bytes == 4  # batch 8 in 4 micro-batches, fp32
    assert (strategy.pipeline, strategy.microbatches, strategy.schedule) == (4, 4, "1f1b")
    assert (strategy.recompute, strategy.recompute_scope) == ("full", "stage")  # each backward reruns its stage
    with pytest.raises(ValueError, match="--microbatches=3: expected a divisor of --batch=8"):
        bench_step_time.pipeline_job(SimpleNamespace(**{**vars(ARGS), "microbatches": 3}))
    with pytest.raises(ValueError, match="microbatches=2: schedule='1f1b' needs at least 4 micro-batches"):
        estimate_step_time(*bench_step_time.pipeline_job(SimpleNamespace(**{**vars(ARGS), "microbatches": 2})),
                           "a100-80gb")


def test_pipeline_row_prediction_runs_on_a_tiny_gpt():
    config, strategy = bench_step_time.pipeline_job(ARGS)
    hw = bench_step_time.calibrate_row(config, strategy, processes=1, threads=1, size=32, seconds=0.01)
    assert hw.kernels and hw.core_sharing is not None and hw.core_sharing.processes == 1
    r = estimate_step_time(config, strategy, hw)
    assert r.pipeline.source == "simulator" and r.pipeline.simulated_microbatches == 4
    assert [c.name for c in r.comm] == ["pipeline activations and gradients"]
    assert set(r.breakdown) == {"compute", "exposed communication", "pipeline bubble", "shared cores",
                                "gradient sync (exposed)", "optimizer"}
    assert sum(r.breakdown.values()) == pytest.approx(r.seconds) and r.seconds > 0
