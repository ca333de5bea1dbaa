"""The layer zoo: every mindspore.nn layer class that runs on CPU, inside a small model, trained
one step in simulation under four strategies with batched execution on (two of them also off), equals one
device (loss, gradients, parameters and buffers) or is refused with an error naming the op;
the layer-zoo table of docs/op_coverage.md is the sweep's current table.

The sweep runs once, in a fresh process with synchronous kernel launches (as the op sweep), and
each layer's outcome is checked by its own test here.
"""
from pathlib import Path

import numpy as np
import pytest
from mindspore import nn

from mindspore_hyper.dtensor.rules import registry
from mindspore_hyper.dtensor.rules.common import make
from mindspore_hyper.tools.coverage import layer_sweep, op_sweep
from mindspore_hyper.tools.coverage.layer_catalog import LAYERS, LayerCase
from sweep_run import sweep_results

DOC = Path(__file__).resolve().parents[3] / "docs" / "op_coverage.md"
RUNS = layer_sweep.runs_per_layer()

# one worker runs the module under pytest-xdist, so the sweep runs once, not once per worker
pytestmark = pytest.mark.xdist_group("layer_zoo")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """name -> LayerResult of every layer case, from one sweep in a fresh process."""
    results = sweep_results(tmp_path_factory.mktemp("zoo"), "mindspore_hyper.tools.coverage.layer_sweep",
                            timeout=900)
    cases = {case.name: case for case in LAYERS}
    return {d["name"]: layer_sweep.LayerResult.from_dict(d, cases[d["name"]]) for d in results}


def test_zoo_covers_the_layer_families():
    names = [case.name for case in LAYERS]
    assert len(names) == len(set(names))
    for family in ("nn.RNN", "nn.GRU (2 layers, bidirectional)", "nn.LSTM (2 layers, bidirectional)", "nn.Conv1d",
                   "nn.Conv2d", "nn.Conv3d", "nn.Conv1dTranspose", "nn.Conv2dTranspose", "nn.Conv3dTranspose",
                   "nn.BatchNorm1d", "nn.BatchNorm2d", "nn.BatchNorm3d", "nn.GroupNorm", "nn.LayerNorm",
                   "nn.Embedding", "nn.MultiheadAttention", "nn.TransformerEncoderLayer", "nn.TransformerDecoderLayer",
                   "nn.MaxPool2d", "nn.AvgPool2d", "nn.Dropout (eval)", "nn.GELU", "nn.Flatten",
                   "nn.Upsample (nearest)"):
        assert family in names, family


@pytest.mark.parametrize("name", [case.name for case in LAYERS])
def test_layer_trains_like_one_device_or_is_refused(outcomes, name):
    outcome = outcomes[name]
    assert not outcome.failed, f"{name}: {outcome.failed}"
    assert len(outcome.passed) + len(outcome.refused) == RUNS, outcome.to_dict()
    for message in outcome.refused.values():
        assert message.split(":")[0], f"{name}: a refusal that names no op: {message}"


def test_docs_table_is_up_to_date(outcomes):
    text = layer_sweep.render([outcomes[case.name] for case in LAYERS])
    assert op_sweep.layers_section(DOC.read_text()) == "\n" + text, \
        "docs/op_coverage.md's layer zoo is stale: run python -m mindspore_hyper.tools.coverage.layer_sweep --write"


def test_sweep_catches_a_wrong_rule(monkeypatch):
    """A ReLU rule that declares its output split along the wrong dimension is a failure, not a pass."""
    def wrong(call):
        x = call.tensors[0]
        return registry.Decision(inputs=[x.layout], outputs=make(x.layout.mesh, list(reversed(x.layout.dims))))

    monkeypatch.setitem(registry.RULES, "ReLU", wrong)
    case = next(c for c in LAYERS if c.name == "nn.ReLU")
    outcome = layer_sweep.run_layer(case, strategies=["tensor dim 0"])
    assert set(outcome.failed) == {"tensor dim 0, batched", "tensor dim 0, per shard"}, outcome.to_dict()
    assert not outcome.ok


class _FailsOnDTensors(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 8)

    def construct(self, x):
        from mindspore_hyper.dtensor import DTensor

        if isinstance(x, DTensor):
            raise ValueError("something")
        return self.fc(x)


def test_sweep_flags_errors_that_do_not_name_the_op():
    outcome = layer_sweep.run_layer(LayerCase("unclear failure", _FailsOnDTensors, (4, 8)), strategies=["tensor dim 0"])
    assert outcome.failed == {"tensor dim 0, batched": "ValueError: something",
                              "tensor dim 0, per shard": "ValueError: something"}


def test_loss_tolerance_is_relative_to_the_terms():
    assert layer_sweep._differs("loss", np.array(1.0 + 5e-6), np.array(1.0), 1.0) == ""
    assert "max abs difference" in layer_sweep._differs("loss", np.array(1.0 + 5e-5), np.array(1.0), 1.0)
