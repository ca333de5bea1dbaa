"""The shape-dependent GEMM efficiency (estimate/gemm_tiling.py) and the unoverlapped gradient sync
(JobStrategy.grad_sync_overlap): both against hand computation from their definitions."""
import os
from dataclasses import replace

import pytest
import yaml

from mindspore_hyper._resources import resource_path
from mindspore_hyper.estimate.gemm_tiling import GemmShape, GemmTiling, backward_shapes, tile_utilisation, utilisation
from mindspore_hyper.estimate.hardware import hardware_from_dict, load_hardware
from mindspore_hyper.estimate.layer_ops import head_forward_ops, layer_forward_ops, op_phase_seconds
from mindspore_hyper.estimate.step_time import estimate_step_time
from mindspore_hyper.estimate.strategy import JobStrategy
from mindspore_hyper.estimate.transformer_config import TransformerConfig

ONE_TILE = GemmTiling(108, ((256, 128),))


def test_a_gemm_of_whole_tiles_and_waves_is_fully_used():
    # 9 x 12 = 108 tiles of 256 x 128: one full wave on 108 SMs
    assert tile_utilisation(GemmShape(1, 256 * 9, 128 * 12, 4096), ONE_TILE) == 1.0
    assert tile_utilisation(GemmShape(4, 256 * 9, 128 * 3, 64), ONE_TILE) == 1.0  # 4 x 27 tiles


def test_tile_quantisation():
    # N = 129: each row of tiles pads 129 to 256 columns in either orientation (216 tiles, 2 full waves)
    assert tile_utilisation(GemmShape(1, 256 * 108, 129, 512), ONE_TILE) == pytest.approx(129 / 256, rel=1e-15)


def test_wave_quantisation():
    # 109 whole tiles take two waves of 108: 109 / 216 of the launched work is useful
    assert tile_utilisation(GemmShape(1, 256 * 109, 128, 512), ONE_TILE) == pytest.approx(109 / 216, rel=1e-15)


def test_more_tiles_never_lower_the_utilisation_and_it_stays_in_0_1():
    more = GemmTiling(108, ((256, 128), (128, 128), (128, 64), (64, 64)))
    for m in (100, 2048, 3000, 32768):
        for n in (96, 160, 768, 2304, 6912):
            shape = GemmShape(3, m, n, 1024)
            one, best = tile_utilisation(shape, ONE_TILE), tile_utilisation(shape, more)
            assert 0 < one <= best <= 1, (m, n)


def test_the_tile_rate_is_the_tiles_l2_roofline():
    # a tm x tn tile loads (tm + tn) tk elements of e bytes per 2 tm tn tk FLOPs
    tiling = GemmTiling(108, ((256, 128), (64, 64)), l2_bandwidth=7219e9)
    peak = 312e12
    assert tiling.tile_rate((64, 64), peak, 2) == pytest.approx(2 * 64 * 64 / (128 * 2) * 7219e9 / peak, rel=1e-15)
    assert tiling.tile_rate((256, 128), peak, 2) == 1.0  # 85 FLOP/byte: above the ridge of 43
    assert GemmTiling(108, ((64, 64),)).tile_rate((64, 64), peak, 2) == 1.0  # no L2 figure: every tile at full rate
    # a GEMM only 64 x 64 tiles fit without padding: the better of 64 x 64 at its L2 rate and 256 x 128 padded
    shape = GemmShape(1, 64 * 108, 64, 512)
    assert tile_utilisation(shape, tiling, peak) == pytest.approx(
        max(tiling.tile_rate((64, 64), peak, 2), 64 / 128 * 54 / 108), rel=1e-15)


def test_several_gemms_combine_by_their_time():
    a, b = GemmShape(1, 256 * 109, 128, 512), GemmShape(1, 256 * 9, 128 * 12, 1024)
    ua, ub = tile_utilisation(a, ONE_TILE), tile_utilisation(b, ONE_TILE)
    assert utilisation((a, b), ONE_TILE) == pytest.approx((a.flops + b.flops) / (a.flops / ua + b.flops / ub),
                                                          rel=1e-15)
    assert utilisation((), ONE_TILE) == 1.0


def test_backward_shapes_are_the_transposes():
    g = GemmShape(2, 10, 20, 30, 4)
    assert backward_shapes(g) == (GemmShape(2, 10, 30, 20, 4), GemmShape(2, 30, 20, 10, 4))
    assert all(x.flops == g.flops for x in backward_shapes(g))


def _tiny():
    return TransformerConfig(layers=4, hidden=1024, heads=16, vocab=32000, seq_len=2048, micro_batch=2)


@pytest.mark.parametrize("attention", ["materialized", "flash"])
def test_each_ops_gemms_are_its_flops(attention):
    st = JobStrategy(tensor=2)
    moe = replace(_tiny(), experts=8, top_k=2, gated_mlp=True)
    for config in (_tiny(), moe):
        for op in layer_forward_ops(config, JobStrategy(tensor=2, data=4, expert=4), attention) + \
                head_forward_ops(config, st):
            if op.kind == "matmul" or (op.kind == "attention" and attention == "materialized"):
                assert sum(g.flops for g in op.gemms) == pytest.approx(op.flops, rel=1e-12), op.name
            else:  # memory ops and the flash kernel: shape-independent
                assert op.gemms == (), op.name


def test_op_times_use_each_phases_utilisation():
    hw = load_hardware("a100-80gb")
    assert hw.gemm_tiling is not None
    plain = replace(hw, gemm_tiling=None)
    eff, peak = hw.efficiency, hw.peak_flops
    ops = {op.name: op for op in layer_forward_ops(_tiny(), JobStrategy(tensor=8), hw.attention)}
    qkv = ops["qkv"]
    (g,) = qkv.gemms
    gi, gw = backward_shapes(g)
    memory = qkv.bytes / (hw.memory_bandwidth * eff.memory)
    expect = [max(qkv.flops / (peak * eff.matmul * tile_utilisation(x, hw.gemm_tiling, peak)), memory)
              for x in (g, gi, gw)]
    assert op_phase_seconds(qkv, hw) == pytest.approx(tuple(expect), rel=1e-12)
    t = max(qkv.flops / (peak * eff.matmul), memory)
    assert op_phase_seconds(qkv, plain) == pytest.approx((t, t, t), rel=1e-15)  # no tiling: the shape-free roofline
    core = ops["attention core"]
    pairs = [s for x in core.gemms for s in backward_shapes(x)]
    memory = core.bytes / (hw.memory_bandwidth * eff.memory)
    assert op_phase_seconds(core, hw)[1] == pytest.approx(
        2 * max(core.flops / (peak * eff.matmul * utilisation(pairs, hw.gemm_tiling, peak)), memory), rel=1e-12)


def _preset(name):
    with open(os.path.join(resource_path("hardware"), name + ".yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize("value, message", [
    ({"sms": 0, "tiles": [[256, 128]]}, "field gemm_tiling.sms=0: expected an int >= 1"),
    ({"sms": 108, "tiles": [[256]]}, r"field gemm_tiling.tiles=\[\[256\]\]: expected a non-empty list of \[tm, tn\]"),
    ({"sms": 108, "tiles": []}, "field gemm_tiling.tiles=.*expected a non-empty list"),
    ({"sms": 108}, "field gemm_tiling.tiles: missing"),
    ({"sms": 108, "tiles": [[256, 128]], "l2": 1}, "field gemm_tiling.l2: unknown"),
    ({"sms": 108, "tiles": [[256, 128]], "l2_bandwidth_GBps": -1},
     "field 'gemm_tiling.l2_bandwidth_GBps': expected a number > 0"),
])
def test_a_bad_gemm_tiling_names_the_file_and_field(value, message):
    data = _preset("a100-80gb")
    data["gemm_tiling"] = value
    with pytest.raises(ValueError, match=f"hardware 'x.yaml': {message}"):
        hardware_from_dict(data, "x.yaml")


def test_gemm_tiling_survives_save_hardware(tmp_path):
    from mindspore_hyper.estimate.calibrate import save_hardware

    hw = load_hardware("a100-80gb")
    assert load_hardware(save_hardware(hw, str(tmp_path / "a.yaml"))).gemm_tiling == hw.gemm_tiling


# --- grad_sync_overlap ---------------------------------------------------------------------------------

def _sync_job(**strategy):
    config = TransformerConfig(layers=24, hidden=2048, heads=16, vocab=51200, seq_len=2048, micro_batch=4)
    return config, JobStrategy(data=16, tensor=2, **strategy)


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_an_unoverlapped_sync_adds_exactly_the_hidden_sync(zero_stage):
    config, st = _sync_job(zero_stage=zero_stage, microbatches=2)
    over = estimate_step_time(config, st, "a100-80gb")
    after = estimate_step_time(config, st.with_(grad_sync_overlap=False), "a100-80gb")
    (term,) = [c for c in over.comm if c.name.startswith("data-parallel gradient")]
    (term_after,) = [c for c in after.comm if c.name.startswith("data-parallel gradient")]
    assert term.hidden == term.seconds > 0  # this job hides its whole sync behind the backward
    assert term_after.seconds == term.seconds and term_after.hidden == 0.0
    assert after.seconds - over.seconds == pytest.approx(term.seconds, rel=1e-9)
    assert after.breakdown["gradient sync (exposed)"] - over.breakdown["gradient sync (exposed)"] == \
        pytest.approx(term.seconds, rel=1e-9)
    assert after.pipeline.makespan == over.pipeline.makespan


def test_without_data_parallelism_the_option_changes_nothing():
    config, _ = _sync_job()
    st = JobStrategy(tensor=2, pipeline=2)
    assert estimate_step_time(config, st.with_(grad_sync_overlap=False), "a100-80gb").seconds == \
        estimate_step_time(config, st, "a100-80gb").seconds


def test_grad_sync_overlap_refusals_name_the_field():
    with pytest.raises(ValueError, match="grad_sync_overlap=False: ZeRO-3 reduce-scatters each layer's gradients"):
        JobStrategy(data=2, zero_stage=3, grad_sync_overlap=False)
    with pytest.raises(ValueError, match="grad_sync_overlap"):
        JobStrategy(grad_sync_overlap="no")
    assert JobStrategy.from_dict({"data": 2, "grad_sync_overlap": False}, "strategy").grad_sync_overlap is False
