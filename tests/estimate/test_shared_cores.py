"""The terms that let the step-time model predict a pipeline of processes sharing CPU cores
(issue 24, item 5): the core-sharing speeds, the pipeline simulated with them, the stage-to-stage
transfer without the peer wait, and the pipeline runtime's whole-stage recomputation; all
against hand-computed values."""
import pytest

from mindspore_hyper.estimate import JobStrategy, TransformerConfig, estimate_step_time, load_hardware
from mindspore_hyper.estimate.calibrate import save_hardware
from mindspore_hyper.estimate.collective_time import collective_seconds, transfer_seconds
from mindspore_hyper.estimate.core_sharing import CoreSharing
from mindspore_hyper.estimate.layer_ops import head_forward_ops, op_seconds
from mindspore_hyper.estimate.pipeline_time import pipeline_makespan

TINY = TransformerConfig(layers=4, hidden=16, heads=2, vocab=32, seq_len=8, micro_batch=1, ffn=64, dtype_bytes=4)
TOY_HW = {"name": "toy", "peak_tflops": 1, "memory_GB": 16, "memory_bandwidth_GBps": 1,
          "levels": [{"name": "shm", "devices": 64, "bandwidth_GBps": 10, "latency_us": 5}],
          "efficiency": {"matmul": 1.0, "memory": 1.0, "network": 0.5, "message_overhead_us": 1},
          "attention": "materialized"}
SHARED = {**TOY_HW, "core_sharing": {"cores": 2, "processes": 4, "threads": 1}}


def test_speeds_of_4_single_threaded_processes_on_2_cores():
    sharing = CoreSharing(cores=2, processes=4, threads=1)
    assert [sharing.share(n) for n in (1, 2, 3, 4, 8)] == pytest.approx([1, 1, 2 / 3, 1 / 2, 1 / 4])
    # measured with 4 computing (half a core each): alone or in pairs twice as fast, 3 at 4/3
    assert [sharing.speed(n) for n in (1, 2, 3, 4, 8)] == pytest.approx([2, 2, 4 / 3, 1, 1 / 2])


def test_speeds_of_threads_and_of_a_profile_measured_alone():
    one = CoreSharing(cores=2, processes=1, threads=2)  # the single-device row: 1 process x 2 threads
    assert one.speed(1) == 1.0 and one.speed(2) == pytest.approx(0.5)
    dedicated = CoreSharing(cores=8, processes=4, threads=2)  # fewer threads than cores: no sharing
    assert [dedicated.speed(n) for n in (1, 4)] == [1.0, 1.0] and dedicated.speed(8) == pytest.approx(0.5)


@pytest.mark.parametrize("field, value", [("cores", 0), ("processes", 1.5), ("threads", True)])
def test_bad_core_sharing_is_named(field, value):
    fields = {"cores": 2, "processes": 4, "threads": 1, field: value}
    with pytest.raises(ValueError, match=f"core_sharing.{field}={value!r}: expected an int >= 1"):
        CoreSharing(**fields)
    with pytest.raises(ValueError, match=rf"hardware '<dict>': field core_sharing.{field}={value!r}"):
        load_hardware({**TOY_HW, "core_sharing": fields})
    with pytest.raises(ValueError, match="computing=0"):
        CoreSharing(2, 4, 1).speed(0)


def test_core_sharing_in_the_hardware_file(tmp_path):
    hw = load_hardware(SHARED)
    assert hw.core_sharing == CoreSharing(2, 4, 1) and load_hardware(TOY_HW).core_sharing is None
    assert load_hardware(save_hardware(hw, str(tmp_path / "cpu.yaml"))).core_sharing == CoreSharing(2, 4, 1)
    with pytest.raises(ValueError, match="field core_sharing.threads: missing"):
        load_hardware({**TOY_HW, "core_sharing": {"cores": 2, "processes": 4}})


def test_pipeline_makespan_with_speeds_by_hand():
    """1F1B p = 2, m = 2, F = 1, B = 2 per stage, speeds (2, 1) (tests/schedule: 6.0 by hand):
    work = 2 x 3 = 6, the dedicated makespan (m + p - 1)(F + B) = 9, so bubble 3 and sharing -3."""
    pipe = pipeline_makespan("1f1b", 2, 2, 1, [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], 0.0, speeds=(2.0, 1.0))
    assert (pipe.makespan, pipe.work, pipe.bubble, pipe.sharing) == pytest.approx((6.0, 6.0, 3.0, -3.0))
    assert pipe.source == "simulator" and pipe.simulated_microbatches == 2
    plain = pipeline_makespan("1f1b", 2, 2, 1, [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], 0.0)
    assert (plain.makespan, plain.sharing) == pytest.approx((9.0, 0.0))
    # one stage: the work at the speed of its one computing rank
    one = pipeline_makespan("1f1b", 1, 3, 1, [1.0], [1.0], [1.0], 0.0, speeds=(0.5,))
    assert (one.makespan, one.work, one.bubble, one.sharing) == pytest.approx((18.0, 9.0, 0.0, 9.0))
    # beyond the simulation limit: the formula's makespan at the speed of every rank computing
    formula = pipeline_makespan("1f1b", 2, 2, 1, [1.0] * 2, [1.0] * 2, [1.0] * 2, 0.0, simulation_limit=0,
                                speeds=(2.0, 0.5))
    assert formula.source == "formula" and formula.makespan == pytest.approx(9.0 / 0.5)
    with pytest.raises(ValueError, match="speeds=.*expected one finite speed > 0 per number of computing ranks"):
        pipeline_makespan("1f1b", 2, 2, 1, [1.0] * 2, [1.0] * 2, [1.0] * 2, 0.0, speeds=(1.0,))


def test_transfer_is_the_send_recv_without_the_peer_wait():
    hw = load_hardware({**TOY_HW, "efficiency": {**TOY_HW["efficiency"], "peer_wait_us": 300}})
    # alpha = 5 + 1 us, beta = 1 / (10 GB/s x 0.5)
    assert transfer_seconds(1e6, hw, (2,)) == pytest.approx(6e-6 + 1e6 / 5e9)
    assert collective_seconds("send_recv", 1e6, hw, (2,)) == pytest.approx(3e-4 + 6e-6 + 1e6 / 5e9)
    assert transfer_seconds(1e6, hw, (1,)) == 0.0
    with pytest.raises(ValueError, match="nbytes=-1"):
        transfer_seconds(-1, hw, (2,))
    # the pipeline's activations and gradients pay the transfer only: the schedule simulation
    # already makes a receive wait for its sender
    r = estimate_step_time(TINY, JobStrategy(pipeline=2, microbatches=2), hw)
    term = [c for c in r.comm if c.name == "pipeline activations and gradients"][0]
    one = transfer_seconds(8 * 16 * 4, hw, (2,))  # T h e
    assert term.count == 4 and term.seconds == pytest.approx(4 * one)


def test_stage_recomputation_runs_the_head_forward_again():
    """recompute_scope='stage': the last stage's backward adds the final norm, LM head and
    cross-entropy forward (their rooflines here), once per micro-batch."""
    hw = load_hardware(TOY_HW)
    layers = estimate_step_time(TINY, JobStrategy(microbatches=3, recompute="full"), hw)
    stage = estimate_step_time(TINY, JobStrategy(microbatches=3, recompute="full", recompute_scope="stage"), hw)
    head = sum(op_seconds(op, hw) for op in head_forward_ops(TINY, JobStrategy()))
    assert stage.seconds - layers.seconds == pytest.approx(3 * head)


def test_recompute_scope_refusals_name_the_field():
    with pytest.raises(ValueError, match="recompute_scope='stage' needs recompute='full'"):
        JobStrategy(recompute="selective", recompute_scope="stage")
    with pytest.raises(ValueError, match="schedule='zb_h1' splits the backward"):
        JobStrategy(pipeline=2, recompute="full", recompute_scope="stage", schedule="zb_h1")
    with pytest.raises(ValueError, match="recompute_scope='all': expected one of 'layers', 'stage'"):
        JobStrategy(recompute_scope="all")


def test_step_time_of_a_pipeline_on_shared_cores():
    """4 stages on a profile measured with 4 processes on 2 cores: the pipelined part is the shared
    simulation with speeds (2, 2, 4/3, 1), the breakdown's "shared cores" its change, and the
    parts still add up to the step."""
    shared, plain = load_hardware(SHARED), load_hardware(TOY_HW)
    st = JobStrategy(pipeline=4, microbatches=4, recompute="full", recompute_scope="stage")
    r, base = estimate_step_time(TINY, st, shared), estimate_step_time(TINY, st, plain)
    assert r.pipeline.work == pytest.approx(base.pipeline.work) and r.pipeline.bubble == pytest.approx(
        base.pipeline.bubble)
    assert r.breakdown["shared cores"] == pytest.approx(r.pipeline.makespan - base.pipeline.makespan)
    assert r.breakdown["shared cores"] < 0 and "shared cores" not in base.breakdown
    assert sum(r.breakdown.values()) == pytest.approx(r.seconds)
    assert r.seconds == pytest.approx(base.seconds + r.breakdown["shared cores"])
    assert any("share 2 cores" in note for note in r.notes)


def test_shared_cores_leave_a_job_measured_at_its_own_concurrency_unchanged():
    """Data 2 x tensor 2 on the profile of its own 4 processes: every process computes at once,
    as when the kernels were measured, so the speed is 1 and nothing changes."""
    st = JobStrategy(data=2, tensor=2, microbatches=2)
    r, base = estimate_step_time(TINY, st, load_hardware(SHARED)), estimate_step_time(TINY, st, load_hardware(TOY_HW))
    assert r.seconds == base.seconds and r.breakdown["shared cores"] == 0.0


def test_bound_processes_share_only_their_own_core():
    """4 processes bound round robin to 2 cores (cpu_binding): ranks 0 and 2 on core 0, 1 and 3 on
    core 1; measured with all 4 computing (2 per core), a rank alone on its core runs twice as fast."""
    speeds = CoreSharing(cores=2, processes=4, threads=1, bound=True).stage_speeds(4, 1)
    assert [speeds(0, frozenset(c)) for c in ({0}, {0, 1}, {0, 2}, {0, 1, 2}, {0, 1, 2, 3})] == [2, 2, 1, 1, 1]
    assert speeds(1, frozenset({0, 1, 2})) == 2  # core 1's other rank (3) is idle
    unbound = CoreSharing(cores=2, processes=4, threads=1).stage_speeds(4, 1)
    assert unbound(1, frozenset({0, 1, 2})) == pytest.approx(4 / 3)  # the OS spreads 3 over 2 cores
    pairs = CoreSharing(cores=2, processes=4, threads=1, bound=True).stage_speeds(2, 2)  # 2 stages x 2 processes
    assert pairs(0, frozenset({0})) == 2 and pairs(0, frozenset({0, 1})) == 1
    roomy = CoreSharing(cores=8, processes=4, threads=2, bound=True).stage_speeds(4, 1)  # a block of 2 cores each
    assert roomy(3, frozenset({3})) == roomy(3, frozenset(range(4))) == 1
    with pytest.raises(ValueError, match="2 stages x 1 processes each = 2 processes, but the profile was measured "
                                         "with processes=4"):
        CoreSharing(cores=2, processes=4, threads=1, bound=True).stage_speeds(2, 1)


def test_the_bound_placement_is_distributed_modes():
    """The cores StageSpeeds assumes are the ones cpu_binding gives (process r of P > C: core r % C)."""
    from mindspore_hyper.runtime.distributed.cpu_binding import cores_for

    for processes, cores in ((4, 2), (6, 4), (3, 2)):
        assert [sorted(cores_for(r, processes, range(cores))) for r in range(processes)] == \
            [[r % cores] for r in range(processes)]


def test_bound_in_the_hardware_file(tmp_path):
    hw = load_hardware({**TOY_HW, "core_sharing": {"cores": 2, "processes": 4, "threads": 1, "bound": True}})
    assert hw.core_sharing.bound and load_hardware(SHARED).core_sharing.bound is False
    assert load_hardware(save_hardware(hw, str(tmp_path / "cpu.yaml"))).core_sharing == hw.core_sharing
    with pytest.raises(ValueError, match="core_sharing.bound='yes': expected a bool"):
        load_hardware({**TOY_HW, "core_sharing": {"cores": 2, "processes": 4, "threads": 1, "bound": "yes"}})


def test_pipeline_makespan_with_bound_speeds_by_hand():
    """1F1B p = 2, m = 2, F = 1, B = 2 per stage on 2 processes bound to 2 cores (a core each): no
    sharing, so the dedicated makespan (m + p - 1)(F + B) = 9."""
    speeds = CoreSharing(cores=2, processes=2, threads=1, bound=True).stage_speeds(2, 1)
    pipe = pipeline_makespan("1f1b", 2, 2, 1, [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], 0.0, speeds=speeds)
    assert (pipe.makespan, pipe.sharing) == pytest.approx((9.0, 0.0))
