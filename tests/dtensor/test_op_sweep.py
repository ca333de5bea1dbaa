"""The op-coverage sweep: every op of the catalog, on DTensors laid out every way on a 2x2
mesh, matches the single-device op or is refused with an error naming it; docs/op_coverage.md
is the sweep's current table.

The sweep runs once, in a fresh process started with synchronous kernel launches (MindSpore's
asynchronous pipeline, once running, makes its thousands of tiny kernels ~10x slower; the
results are the same), and each op's outcome is checked by its own test here.
"""
from pathlib import Path

import pytest
from mindspore import ops

from mindspore_hyper.dtensor import DTensor
from mindspore_hyper.dtensor.rules import registry
from mindspore_hyper.dtensor.rules.common import make
from mindspore_hyper.tools.coverage import op_sweep
from mindspore_hyper.tools.coverage.op_catalog import CATALOG, Arg, OpCase
from sweep_run import sweep_results

DOC = Path(__file__).resolve().parents[2] / "docs" / "op_coverage.md"

# one worker runs the module under pytest-xdist, so the sweep runs once, not once per worker
pytestmark = pytest.mark.xdist_group("op_sweep")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """name -> CaseResult of every catalog op, from one sweep in a fresh process."""
    results = sweep_results(tmp_path_factory.mktemp("sweep"), "mindspore_hyper.tools.coverage.op_sweep", timeout=600)
    cases = {case.name: case for case in CATALOG}
    return {d["name"]: op_sweep.CaseResult.from_dict(d, cases[d["name"]]) for d in results}


def test_catalog_covers_at_least_150_distinct_ops():
    names = [case.name for case in CATALOG]
    assert len(names) == len(set(names))
    assert len(names) >= 150


@pytest.mark.parametrize("name", [case.name for case in CATALOG])
def test_op_matches_one_device_or_is_refused(outcomes, name):
    outcome = outcomes[name]
    assert not outcome.mismatches, f"{name}: wrong values on DTensors: {outcome.mismatches}"
    assert not outcome.unclear, f"{name}: failed without naming the op: {outcome.unclear}"


def test_docs_table_is_up_to_date(outcomes):
    text = op_sweep.render([outcomes[case.name] for case in CATALOG])
    assert op_sweep.ops_section(DOC.read_text()) == text, \
        "docs/op_coverage.md is stale: run python -m mindspore_hyper.tools.coverage.op_sweep"


def test_sweep_catches_a_wrong_rule(monkeypatch):
    """A rule that declares the wrong output split is reported as a mismatch, not passed."""
    def wrong(call):
        x = call.tensors[0]
        return registry.Decision(inputs=[x.layout], outputs=make(x.layout.mesh, list(reversed(x.layout.dims))))

    monkeypatch.setitem(registry.RULES, "Neg", wrong)
    outcome = op_sweep.run_case(OpCase("ops.neg (wrong rule)", ops.neg, (Arg((4, 4)),)))
    assert outcome.mismatches and not outcome.ok


def test_sweep_flags_errors_that_do_not_name_the_op():
    def fails_on_dtensors(x):
        if isinstance(x, DTensor):
            raise ValueError("something")
        return x

    outcome = op_sweep.run_case(OpCase("unclear failure", fails_on_dtensors, (Arg((4, 4)),)))
    assert outcome.unclear and not outcome.ok
