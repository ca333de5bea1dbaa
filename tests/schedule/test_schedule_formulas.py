"""Simulated bubbles and live activations against the published formulas (unit costs, zero p2p)."""
import pytest

from mindspore_hyper.schedule import ActionKind, build_schedule, simulate_schedule
from mindspore_hyper.schedule.formulas import bubble_fraction, published_idle

SIZES = [(p, m) for p in (2, 3, 4, 8) for m in sorted({p, p + 1, 2 * p, 4 * p})]
COSTS = [(1.0, 1.0, 1.0), (2.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.5, 0.5, 0.25)]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", SIZES)
def test_gpipe_and_1f1b_idle_is_p_minus_1_times_f_b_w(kind, p, m):
    t = simulate_schedule(build_schedule(kind, p, m))
    F = B = W = 1.0
    assert [t.bubble_time(r) for r in range(p)] == [(p - 1) * (F + B + W)] * p
    assert t.makespan == m * (F + B + W) + (p - 1) * (F + B + W)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("F,B,W", COSTS)
def test_gpipe_and_1f1b_idle_with_other_costs(kind, F, B, W):
    p, m = 4, 8
    t = simulate_schedule(build_schedule(kind, p, m), forward=F, backward_input=B, backward_weight=W)
    assert [t.bubble_time(r) for r in range(p)] == [(p - 1) * (F + B + W)] * p


@pytest.mark.parametrize("p,m", SIZES)
@pytest.mark.parametrize("F,B,W", COSTS)
def test_zb_h1_idle_is_p_minus_1_times_f_plus_b_minus_w(p, m, F, B, W):
    t = simulate_schedule(build_schedule("zb_h1", p, m), forward=F, backward_input=B, backward_weight=W)
    assert [t.bubble_time(r) for r in range(p)] == [(p - 1) * (F + B - W)] * p
    assert published_idle("zb_h1", p, 1, F, B, W) == (p - 1) * (F + B - W)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 4])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_interleaved_idle_is_divided_by_v(p, v, groups):
    m = groups * p
    F = B = W = 1.0  # per microbatch for a rank's whole share; one chunk action costs 1/v of it
    t = simulate_schedule(build_schedule("interleaved_1f1b", p, m, v), forward=F / v, backward_input=B / v,
                 backward_weight=W / v)
    assert [t.bubble_time(r) for r in range(p)] == [(p - 1) * (F + B + W) / v] * p
    assert t.bubble_fraction == bubble_fraction((p - 1) * (F + B + W) / v, m)


def test_interleaved_idle_with_three_chunks():
    p, m, v = 4, 8, 3
    t = simulate_schedule(build_schedule("interleaved_1f1b", p, m, v), forward=1 / v, backward_input=1 / v,
                 backward_weight=1 / v)
    for r in range(p):
        assert t.bubble_time(r) == pytest.approx((p - 1) * 3 / v, abs=1e-12)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("m_over_p", [2, 3, 4])
def test_zb_v_has_no_bubble_inside_each_rank_span(p, m_over_p):
    m = m_over_p * p
    t = simulate_schedule(build_schedule("zb_v", p, m, 2))
    assert [t.span_bubble_time(r) for r in range(p)] == [0.0] * p
    # over the synchronous step only the fill of the first forward down the V remains: rank p-1
    # cannot start before p-1 chunk forwards ran, and no rank ever waits after that
    assert t.makespan == (p - 1) * 1.0 + m * 6 * 1.0


@pytest.mark.parametrize("p,m", SIZES)
def test_1f1b_keeps_p_microbatches_alive_on_stage_0_and_gpipe_keeps_m(p, m):
    one_f_one_b = simulate_schedule(build_schedule("1f1b", p, m))
    gpipe = simulate_schedule(build_schedule("gpipe", p, m))
    assert one_f_one_b.peak_inflight(0) == p
    assert [one_f_one_b.peak_inflight(r) for r in range(p)] == [p - r for r in range(p)]
    assert [gpipe.peak_inflight(r) for r in range(p)] == [m] * p


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16)])
def test_zero_bubble_schedules_keep_1f1b_memory(p, m):
    assert [simulate_schedule(build_schedule("zb_h1", p, m)).peak_inflight(r) for r in range(p)] == [p] * p
    # ZB-V counts chunk activations: 2p halves of a rank's share = p microbatches' worth
    assert [simulate_schedule(build_schedule("zb_v", p, m, 2)).peak_inflight(r) for r in range(p)] == [2 * p] * p


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 3), (8, 2)])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_megatron_interleaved_warmup_count(p, v, groups):
    m = groups * p
    schedule = build_schedule("interleaved_1f1b", p, m, v)
    for rank in range(p):
        kinds = [a.kind for a in schedule.actions[rank] if a.is_compute]
        warmup = kinds.index(ActionKind.BACKWARD)
        if m == p:  # Megatron-LM runs every forward first when m == p
            expected = m * v
        else:
            expected = min((p - rank - 1) * 2 + (v - 1) * p, m * v)
        # the first backward follows the warm-up forwards and the first steady forward
        assert warmup == min(expected + 1, m * v)


def test_gpipe_p2p_latency_adds_two_crossings_per_boundary():
    p, m, d = 4, 8, 0.25
    t = simulate_schedule(build_schedule("gpipe", p, m), p2p=d)
    assert t.makespan == (m + p - 1) * 3.0 + 2 * (p - 1) * d


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("m_over_p", [2, 3, 4])
@pytest.mark.parametrize("w", [1.0, 0.75, 0.5, 0.25])
def test_dualpipe_v_idle_is_the_dualpipe_formula_with_pp_2p_stages(p, m_over_p, w):
    # per chunk: forward f = input-gradient b (the symmetric case the formula describes), weight w
    f = b = 1.0
    t = simulate_schedule(build_schedule("dualpipe_v", p, m_over_p * p, 2), forward=f, backward_input=b, backward_weight=w)
    full_backward = b + w
    f_and_b = f + full_backward  # an overlapped pair costs both computes here: nothing to hide
    pp = 2 * p
    assert [t.bubble_time(r) for r in range(p)] == [(pp / 2 - 1) * (f_and_b + full_backward - 3 * w)] * p
    assert published_idle("dualpipe_v", p, 2, 2 * f, 2 * b, 2 * w) == (pp / 2 - 1) * (f_and_b + full_backward - 3 * w)
    # DualPipe's activation memory, PP + 1 chunks
    assert [t.peak_inflight(r) for r in range(p)] == [pp + 1] * p
