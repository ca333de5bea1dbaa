"""Pipeline 2 over a converted decoder whose layers return a tuple (BLOOM's generated layer returns
(hidden_states, None) and the loop takes element 0), at the sweep's tiny config: one step's loss and
gradients equal one device's within migrate_sweep.TOL (the tolerance derived in its docstring)."""
import pytest

import migrate_sweep as sweep
from mindspore_hyper.migrate import convert

pytestmark = pytest.mark.usefixtures("pynative")


def test_bloom_layers_returning_a_tuple_pipeline_like_one_device():
    model = sweep.build_model("bloom", "causal-lm")
    cell, report = convert(sweep.wrapped(model, "causal-lm"), sweep.inputs_for(model, "causal-lm", 2, 8, seed=0))
    _, ms_loss = sweep.losses("causal-lm", report, 5)
    error = sweep.pipeline_step_error(cell, sweep.inputs_for(model, "causal-lm", 2, 8, seed=10), ms_loss)
    assert error <= sweep.TOL
