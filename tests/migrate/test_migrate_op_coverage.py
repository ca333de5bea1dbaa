"""Every registered mapping runs on MindSpore's CPU kernels and matches torch: a model using every
mapped torch function, method, operator and module is converted through torch.fx and through
torch.export (aten ops), and both Cells are compared with torch (<= 1e-5 relative); a small model of the
ops only a shape-general export keeps (sizes read at run time) is converted with structure="modules"."""
import os

import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.mappings import function_mappings, module_mappings
from mindspore_hyper.migrate.state_dict import NAME_RULES

from migrate_models import TOL
from migrate_zoo import DynamicZoo, OpZoo, zoo_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def conversions():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    model = OpZoo().eval()
    found = {tracer: convert(model, zoo_inputs(), tracer=tracer, structure="flat")[1] for tracer in ("fx", "export")}
    found["modules"] = convert(DynamicZoo(), torch.randn(2, 5, 3), structure="modules")[1]
    return found


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_zoo_matches_torch(conversions, tracer):
    report = conversions[tracer]
    assert report.tracer == f"torch.{tracer}"
    assert report.check["max_relative_error"] <= TOL
    assert len(report.outputs) > 250


def test_dynamic_zoo_matches_torch_at_another_shape(conversions):
    assert conversions["modules"].check["max_relative_error"] <= TOL
    cell, _ = convert(DynamicZoo(), torch.randn(2, 5, 3), structure="modules", check=False)
    from migrate_models import assert_same_outputs

    assert_same_outputs(cell, DynamicZoo(), torch.randn(4, 9, 3))


def test_every_mapping_is_exercised(conversions):
    used = {use.torch_op for report in conversions.values() for use in report.uses}
    registered = {m.torch_name for m in function_mappings()} | {
        f"torch.nn.{m.torch_type.__name__}" for m in module_mappings()}
    assert registered - used == set()


def test_module_parameter_names_follow_the_state_dict_rules():
    for mapping in module_mappings():
        for torch_name, ms_name in mapping.params.items():
            assert ms_name == torch_name or ms_name in NAME_RULES[torch_name], (mapping.torch_type, torch_name)


def test_docs_table_lists_every_mapping():
    with open(os.path.join(ROOT, "docs", "migration.md"), encoding="utf-8") as f:
        text = f.read()
    missing = [m.torch_name for m in function_mappings() if f"`{m.torch_name}`" not in text]
    missing += [m.torch_type.__name__ for m in module_mappings() if f"`torch.nn.{m.torch_type.__name__}`" not in text]
    assert missing == []
