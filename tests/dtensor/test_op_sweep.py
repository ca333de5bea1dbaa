"""The op-coverage sweep: every op of the catalog, on DTensors laid out every way on a 2x2
mesh, matches the single-device op or is refused with an error naming it; docs/op_coverage.md
is the sweep's current table."""
from pathlib import Path

import mindspore as ms
import pytest
from mindspore import ops

from mindspore_hyper.dtensor import DTensor, coverage
from mindspore_hyper.dtensor.op_catalog import CATALOG, Arg, OpCase
from mindspore_hyper.dtensor.rules import registry
from mindspore_hyper.dtensor.rules.common import make

DOC = Path(__file__).resolve().parents[2] / "docs" / "op_coverage.md"
_RESULTS = {}


@pytest.fixture(autouse=True, scope="module")
def _synchronous_kernels():
    """Thousands of tiny kernels: synchronous launches are ~10x faster than MindSpore's
    asynchronous pipeline, with the same results."""
    before = ms.get_context("pynative_synchronize")
    ms.set_context(pynative_synchronize=True)
    yield
    ms.set_context(pynative_synchronize=before)


def result(case: OpCase) -> coverage.CaseResult:
    if case.name not in _RESULTS:
        _RESULTS[case.name] = coverage.run_case(case)
    return _RESULTS[case.name]


def test_catalog_covers_at_least_150_distinct_ops():
    names = [case.name for case in CATALOG]
    assert len(names) == len(set(names))
    assert len(names) >= 150


@pytest.mark.parametrize("case", CATALOG, ids=[case.name for case in CATALOG])
def test_op_matches_one_device_or_is_refused(case):
    outcome = result(case)
    assert not outcome.mismatches, f"{case.name}: wrong values on DTensors: {outcome.mismatches}"
    assert not outcome.unclear, f"{case.name}: failed without naming the op: {outcome.unclear}"


def test_docs_table_is_up_to_date():
    text = coverage.render([result(case) for case in CATALOG])
    assert DOC.read_text() == text, "docs/op_coverage.md is stale: run python -m mindspore_hyper.dtensor.coverage"


def test_sweep_catches_a_wrong_rule(monkeypatch):
    """A rule that declares the wrong output split is reported as a mismatch, not passed."""
    def wrong(call):
        x = call.tensors[0]
        return registry.Decision(inputs=[x.layout], outputs=make(x.layout.mesh, list(reversed(x.layout.dims))))

    monkeypatch.setitem(registry.RULES, "Neg", wrong)
    outcome = coverage.run_case(OpCase("ops.neg (wrong rule)", ops.neg, (Arg((4, 4)),)))
    assert outcome.mismatches and not outcome.ok


def test_sweep_flags_errors_that_do_not_name_the_op():
    def fails_on_dtensors(x):
        if isinstance(x, DTensor):
            raise ValueError("something")
        return x

    outcome = coverage.run_case(OpCase("unclear failure", fails_on_dtensors, (Arg((4, 4)),)))
    assert outcome.unclear and not outcome.ok
