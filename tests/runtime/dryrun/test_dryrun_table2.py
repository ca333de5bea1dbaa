"""The dry run's activations of examples/models.py's GPT against Korthikanti et al.'s Table 2, term
by term (mindspore_hyper/estimate/table2_correspondence.py), and its ZeRO model states against the
estimator.

A layer's dry-run bytes are measured as the difference between the same GPT with 2 layers and with
1 (every other tensor is the same), so the per-layer figure is exact, not fitted. All counts are
integers (elements x bytes), so the comparisons are exact equalities, except the whole-model one
against the estimator's approximate "simulation" accounting (see its test).
"""
import os
import sys
from fractions import Fraction

import pytest

from mindspore_hyper.estimate import JobStrategy, activation_bytes_per_layer, preset
from mindspore_hyper.estimate.crosscheck import crosscheck_gpt, seeded_gpt_batch, simulate_step
from mindspore_hyper.estimate.gpt_layout import gpt_parallel_config
from mindspore_hyper.estimate.simulation_activations import simulation_activation_bytes
from mindspore_hyper.estimate.table2_correspondence import (DROPOUT_TERMS, STORED_TERMS, dryrun_layer_bytes,
                                                            dryrun_layer_elements, table2_terms)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples"))
from models import GPT  # noqa: E402  examples/models.py

# (s, b, h, a, t): small shapes whose terms are all distinct numbers (B=1152, F=4608, S=384,
# s^2=64, bs=24, h=48), and layers of hidden 2048 no simulation on this machine holds
SHAPES = [(8, 3, 48, 2, 1), (8, 3, 48, 2, 2), (16, 2, 64, 4, 4), (1024, 1, 2048, 16, 1), (1024, 2, 2048, 16, 4)]
VOCAB = 32000


def _config(s, b, h, a, layers):
    return preset("gpt-example").with_(vocab=VOCAB, hidden=h, ffn=4 * h, heads=a, kv_heads=a, layers=layers,
                                       seq_len=s, micro_batch=b)


def _dry_run_activations(s, b, h, a, t, layers):
    """Every device's dry-run activations_peak of one training step of the GPT on data 1 x tensor t."""
    model, ids, labels = seeded_gpt_batch(GPT, _config(s, b, h, a, layers), 1, 0, lazy=True)
    report = simulate_step(model, gpt_parallel_config(JobStrategy(tensor=t)), (ids, labels), shapes_only=True)
    return {rank: m["activations_peak"] for rank, m in report.memory.items()}


@pytest.mark.parametrize("s, b, h, a, t", SHAPES)
def test_table2_terms_add_up_to_the_row(s, b, h, a, t):
    # rows 1 (t = 1) and 2 (t > 1), exact fractions
    assert sum(table2_terms(s, b, h, a, t).values()) == activation_bytes_per_layer(s, b, h, a, t)


@pytest.mark.parametrize("s, b, h, a, t", SHAPES)
def test_every_stored_table2_term_is_one_dry_run_tensor_at_16_bits(s, b, h, a, t):
    paper, dry = table2_terms(s, b, h, a, t), dryrun_layer_elements(s, b, h, a, t)
    assert set(paper) == set(STORED_TERMS) | set(DROPOUT_TERMS)
    for name in STORED_TERMS:
        assert paper[name] == 2 * dry[name], name  # 2 bytes per element in the paper
    extras = {name for name in dry if name not in STORED_TERMS}
    assert all(name.startswith("extra: ") for name in extras)
    # Table 2 = 2 x stored + dropout; the dry run = 4 x (stored + extra)
    stored = sum(dry[name] for name in STORED_TERMS)
    dropout = sum(paper[name] for name in DROPOUT_TERMS)
    assert activation_bytes_per_layer(s, b, h, a, t) == 2 * stored + dropout
    assert dryrun_layer_bytes(s, b, h, a, t) == 4 * (stored + sum(dry[name] for name in extras))
    sbh, as2b = s * b * h, a * s * s * b
    assert dropout == 2 * sbh + Fraction(3 * as2b, t)  # two sbh masks, the softmax's mask and output


@pytest.mark.parametrize("s, b, h, a, t", SHAPES)
def test_a_dry_run_layer_is_the_correspondence_exactly(pynative, s, b, h, a, t):
    """Per device and layer, float32: the dry run's bytes == 4 x (Table 2's stored elements + the
    extra intermediates), with no tolerance."""
    one, two = _dry_run_activations(s, b, h, a, t, 1), _dry_run_activations(s, b, h, a, t, 2)
    assert set(two) == set(range(t))
    for rank in two:
        assert two[rank] - one[rank] == dryrun_layer_bytes(s, b, h, a, t), (rank, s, b, h, a, t)


def test_the_whole_model_within_one_percent_of_the_estimators_accounting(pynative):
    """GPT of hidden 2048, 4 layers, sequence 1024, vocabulary 32000 on one device: the dry run's
    activations within 1% of the estimator's "simulation" accounting (the layers' terms plus the
    embedding and the loss). That accounting approximates: it leaves out each LayerNorm's mean and
    rstd (4bs elements per layer) and about one bsh of the head and loss, together 0.22% here
    (measured); 1% is the issue's bound for where the estimator approximates."""
    s, b, h, a, layers = 1024, 1, 2048, 16, 4
    measured = _dry_run_activations(s, b, h, a, 1, layers)[0]
    estimated = simulation_activation_bytes(_config(s, b, h, a, layers), b)
    assert abs(estimated - measured) / measured < 0.01


@pytest.mark.parametrize("strategy", [JobStrategy(data=2, tensor=2, zero_stage=0),
                                      JobStrategy(data=4, tensor=2, zero_stage=1)],
                         ids=["data 2 x tensor 2, ZeRO-0", "data 4 x tensor 2, ZeRO-1"])
def test_zero_model_states_equal_the_estimator(pynative, strategy):
    """Parameters, gradients and Adam states per device equal the estimator's exactly (ZeRO-1
    pipeline and ZeRO-3 are in test_dryrun_equals_simulation.py; ZeRO-2 has no layout here)."""
    rows = crosscheck_gpt(GPT, _config(1024, 1, 2048, 16, 2), strategy, shapes_only=True)
    assert len({r.rank for r in rows}) == strategy.devices
    states = [r for r in rows if r.kind != "activations"]
    assert len(states) == 3 * strategy.devices
    for r in states:
        assert r.estimated == r.measured, r


@pytest.mark.parametrize("kwargs, match", [
    ({"tensor_parallel": 3}, r"tensor_parallel=3: expected a divisor of heads=2"),
    ({"hidden": 47}, r"hidden=47: expected a multiple of heads=2"),
    ({"seq_len": 0}, r"seq_len=0: expected an int >= 1"),
])
def test_bad_shapes_are_named(kwargs, match):
    args = {"seq_len": 8, "micro_batch": 3, "hidden": 48, "heads": 2, **kwargs}
    for fn in (table2_terms, dryrun_layer_elements, dryrun_layer_bytes):
        with pytest.raises(ValueError, match=match):
            fn(**args)
