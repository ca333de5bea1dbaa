"""Strategy search: every result fits and uses all devices, results are ranked by the step-time
model, the dominance rules lose nothing against exhaustive enumeration, bad arguments are named;
and `plan --search` / `estimate --hardware --context` in-process."""
import json

import pytest

from mindspore_hyper.cli import main
from mindspore_hyper.estimate import JobStrategy, TransformerConfig, estimate_job, estimate_step_time, load_hardware
from mindspore_hyper.estimate.search import fitting_candidates, plot_front, search_strategies

MODEL = TransformerConfig(layers=16, hidden=2048, heads=16, vocab=32000, seq_len=2048)
A100 = load_hardware("a100-80gb")


def test_results_fit_use_every_device_and_are_ranked():
    results = search_strategies(MODEL, 16, A100, 32, top=5)
    assert len(results) == 5
    seconds = [r.seconds for r in results]
    assert seconds == sorted(seconds)
    for r in results:
        st = r.strategy
        assert st.devices == 16
        assert st.step_microbatches * r.config.micro_batch * st.data == 32
        peak = estimate_job(r.config, st).peak.total
        assert peak == r.memory.total <= 0.9 * A100.memory_bytes
        assert r.estimate.seconds == pytest.approx(estimate_step_time(r.config, st, A100).seconds)
        assert st.sequence_parallel == (st.tensor > 1)


def test_dominance_rules_lose_nothing_against_exhaustive_enumeration():
    # a tight budget so that recomputation matters: every (t, p, sp, zero, recompute) on 8 devices
    budget_fraction = 0.03
    best = None
    for t in (1, 2, 4, 8):
        for p in (1, 2, 4, 8):
            if t * p > 8:
                continue
            d = 8 // (t * p)
            for sp in ({False, True} if t > 1 else {False}):
                for zero in (0, 1):
                    for mode in ("none", "selective", "full"):
                        st = JobStrategy(data=d, tensor=t, pipeline=p, sequence_parallel=sp, zero_stage=zero,
                                         recompute=mode, microbatches=16 // d)
                        if estimate_job(MODEL, st).peak.total > budget_fraction * A100.memory_bytes:
                            continue
                        seconds = estimate_step_time(MODEL, st, A100).seconds
                        best = seconds if best is None else min(best, seconds)
    found = search_strategies(MODEL, 8, A100, 16, top=1, micro_batches=(1,), schedules=("1f1b",), zero_stages=(0, 1),
                              memory_fraction=budget_fraction)
    assert best is not None and found[0].seconds == pytest.approx(best)
    assert found[0].strategy.recompute == "full"  # the budget forced recomputation


def test_memory_pruning_and_progress():
    calls = []
    assert fitting_candidates(MODEL, 8, A100, 16, memory_fraction=0.001,
                              progress=lambda done, total: calls.append((done, total))) == []
    assert calls and calls[-1][0] == calls[-1][1]


def test_front_plot(tmp_path):
    path = tmp_path / "front.png"
    plot_front(fitting_candidates(MODEL, 8, A100, 16, micro_batches=(1,)), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("kwargs, message", [
    ({"devices": 0}, "devices=0: expected an int >= 1"),
    ({"devices": 8192}, "devices=8192: hardware 'a100-80gb' has 4480"),
    ({"schedules": ("1f1b", "pipedream")}, "schedules: 'pipedream' unknown"),
    ({"memory_fraction": 1.5}, "memory_fraction=1.5"),
    ({"top": 0}, "top=0: expected an int >= 1"),
])
def test_bad_arguments_are_named(kwargs, message):
    args = {"devices": 8, "top": 1, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        search_strategies(MODEL, args.pop("devices"), A100, 16, **args)


def test_plan_search_cli(capsys, tmp_path):
    png = tmp_path / "front.png"
    code = main(["plan", "--search", "--layers", "16", "--hidden", "2048", "--heads", "16", "--vocab", "32000",
                 "--seq-len", "2048", "--devices", "8", "--global-batch", "16", "--top", "2", "--micro-batches", "1",
                 "--json", "--plot", str(png)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    best = search_strategies(MODEL, 8, A100, 16, top=2, micro_batches=(1,))
    assert [r["estimate"]["seconds"] for r in out["results"]] == pytest.approx([r.seconds for r in best])
    assert out["results"][0]["describe"] == best[0].describe() and png.exists()
    code = main(["plan", "--search", "--preset", "llama2-7b", "--devices", "8", "--global-batch", "16", "--top", "1"])
    text = capsys.readouterr().out
    assert code == 0 and "#1 " in text and "memory (stage" in text and "time: compute" in text


def test_plan_search_cli_errors(capsys):
    for argv, message in ((["plan", "--search", "--devices", "8", "--global-batch", "8"], "--search needs a model"),
                          (["plan", "--search", "--preset", "llama2-7b", "--devices", "8"],
                           "--search needs --global-batch"),
                          (["plan", "--search", "--data", "2", "--preset", "llama2-7b"],
                           "--search chooses the strategy"),
                          (["plan", "--data", "2", "--devices", "8"], "--devices: only with --search")):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2 and message in capsys.readouterr().err


def test_estimate_cli_step_time_and_context_sweep(capsys):
    code = main(["estimate", "--preset", "gpt3-175b", "--tensor", "8", "--pipeline", "8", "--microbatches", "64",
                 "--sequence-parallel", "--recompute", "selective", "--hardware", "a100-80gb", "--json"])
    out = json.loads(capsys.readouterr().out)
    strategy = JobStrategy(tensor=8, pipeline=8, microbatches=64, sequence_parallel=True, recompute="selective")
    from mindspore_hyper.estimate import preset

    assert code == 0 and out["step_time"]["seconds"] == pytest.approx(
        estimate_step_time(preset("gpt3-175b"), strategy, "a100-80gb").seconds)
    code = main(["estimate", "--preset", "llama2-7b", "--tensor", "8", "--context", "4", "--recompute", "selective",
                 "--sequence-parallel", "--device-memory", "64GiB", "--sweep", "64K,128K"])
    text = capsys.readouterr().out
    assert code == 0 and "x context 4 (ring) = 32 devices" in text
    assert "seq  131072:" in text and "without context parallel 82.51 GiB, does NOT fit" in text
    with pytest.raises(SystemExit):
        main(["estimate", "--preset", "llama2-7b", "--context", "3"])
    assert "--context 3: seq_len=4096 must divide" in capsys.readouterr().err


def test_weak_scaling_points():
    from mindspore_hyper.estimate.scaling import plot_scaling, weak_scaling

    points = weak_scaling(MODEL, [8, 16], A100, per_device_batch=2, micro_batches=(1,), schedules=("1f1b",))
    assert [p.devices for p in points] == [8, 16] and [p.global_batch for p in points] == [16, 32]
    assert points[0].efficiency == 1.0
    first, second = (p.best.estimate.tokens_per_second / p.devices for p in points)
    assert points[1].efficiency == pytest.approx(second / first)
    with pytest.raises(ValueError, match="expected increasing device counts"):
        weak_scaling(MODEL, [16, 8], A100)
    with pytest.raises(ValueError, match="plot_scaling: no point fits"):
        plot_scaling([], "unused.png")


def test_plan_search_verify_simulates_the_best_runnable_strategy(capsys):
    code = main(["plan", "--search", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128",
                 "--seq-len", "16", "--devices", "4", "--global-batch", "8", "--top", "2", "--verify", "--json"])
    out = json.loads(capsys.readouterr().out)
    v = out["verify"]
    assert code == 0 and v["describe"] == out["results"][0]["describe"]
    assert v["loss_relative_error"] < 1e-5 and v["memory_exact"]
    assert len(v["devices"]) == 4 * 3 and all(d["estimated"] == d["simulated"] for d in v["devices"])
    assert {d["kind"] for d in v["devices"]} == {"parameters", "gradients", "optimizer_states"}


def test_verify_refuses_what_the_simulation_cannot_run():
    from mindspore_hyper.estimate.verify import verify_search_result

    results = search_strategies(MODEL.with_(gated_mlp=True), 8, A100, 16, top=1, micro_batches=(1,))
    with pytest.raises(ValueError, match="gated_mlp=True differs from its False"):
        verify_search_result(results, object)
    zero2 = [r for r in fitting_candidates(MODEL, 8, A100, 16, micro_batches=(1,), zero_stages=(2,))]
    with pytest.raises(ValueError, match="no result the simulation's GPT layout runs"):
        verify_search_result(zero2[:3], object)


def test_verify_compares_against_the_strategy_its_layout_resolves_to(monkeypatch):
    """verify reads the simulated strategy off the resolved table (`job_strategy_of`): a layout
    that does not resolve to the searched sizes is refused before the simulated step."""
    import os
    import sys

    from mindspore_hyper.estimate import crosscheck, gpt_parallel_config
    from mindspore_hyper.estimate.verify import verify_search_result

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
    from models import GPT  # examples/models.py

    tiny = TransformerConfig(layers=2, hidden=64, heads=4, vocab=128, seq_len=16)
    results = search_strategies(tiny, 4, A100, 8, top=1, micro_batches=(1,))
    asked = results[0].strategy
    # a layout with twice the tensor size handed in for the searched strategy (heads 4, so 2 or 4 divide)
    monkeypatch.setattr(crosscheck, "gpt_parallel_config",
                        lambda s: gpt_parallel_config(s.with_(tensor=2 if s.tensor == 1 else 1)))
    laid = 2 if asked.tensor == 1 else 1
    with pytest.raises(ValueError, match=f"verify: the GPT's resolved layout is not the strategy's: "
                                         f"tensor={asked.tensor} asked, {laid} laid out"):
        verify_search_result(results, GPT)

