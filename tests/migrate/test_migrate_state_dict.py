"""convert_state_dict(): the design's TransformerBlock into a hand-written Cell, name/layout rules,
hyper-parameter differences, and one clear error for every entry that does not fit."""
import numpy as np
import pytest
import torch
import mindspore as ms
from mindspore import nn

from mindspore_hyper.migrate import StateDictMismatchError, convert_state_dict

from migrate_models import MsTransformerBlock, TorchTransformerBlock, assert_same_outputs


pytestmark = pytest.mark.usefixtures("pynative")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_transformer_block_into_hand_written_cell():
    torch_block, cell = TorchTransformerBlock().eval(), MsTransformerBlock()
    report = convert_state_dict(torch_block, cell)
    moved = {p.torch_name: p.cell_name for p in report.placed}
    assert moved["ln1.weight"] == "ln1.gamma" and moved["ln2.bias"] == "ln2.beta"
    assert moved["attn.qkv.weight"] == "attn.qkv.weight"
    # MindSpore's nn.LayerNorm defaults to epsilon 1e-7: set to torch's 1e-5, and reported
    assert {(h.path, h.torch_value, h.cell_value, h.applied) for h in report.hyperparameters} == {
        ("ln1", 1e-5, 1e-7, True), ("ln2", 1e-5, 1e-7, True)}
    assert cell.ln1.epsilon == 1e-5
    assert_same_outputs(cell, torch_block, torch.randn(2, 8, 32))


def test_hyperparameters_reported_but_not_applied():
    torch_block, cell = TorchTransformerBlock(), MsTransformerBlock()
    report = convert_state_dict(torch_block, cell, apply_hyperparameters=False)
    assert [h.applied for h in report.hyperparameters] == [False, False]
    assert cell.ln1.epsilon == 1e-7
    assert "NOT applied" in str(report)


def test_plain_state_dict_has_no_hyperparameter_check():
    torch_block, cell = TorchTransformerBlock(), MsTransformerBlock()
    report = convert_state_dict(torch_block.state_dict(), cell)
    assert report.hyperparameters == [] and len(report.placed) == 12


def test_batchnorm_names_and_momentum():
    torch_bn = torch.nn.BatchNorm2d(3, momentum=0.2)
    torch_bn.running_mean.uniform_()
    cell = nn.BatchNorm2d(3)  # momentum 0.9 = torch's 0.1
    wrapper_t, wrapper_m = torch.nn.Sequential(torch_bn), nn.SequentialCell([cell])
    report = convert_state_dict(wrapper_t, wrapper_m)
    assert {p.torch_name: p.cell_name for p in report.placed}["0.running_var"] == "0.moving_variance"
    assert report.dropped == ["0.num_batches_tracked"]
    assert [(h.name.split()[0], h.torch_value) for h in report.hyperparameters] == [("momentum", 0.2)]
    wrapper_t.train()
    wrapper_m.set_train(True)
    x = torch.randn(4, 3, 5, 5)
    assert_same_outputs(wrapper_m, wrapper_t, x)
    np.testing.assert_allclose(cell.moving_mean.asnumpy(), torch_bn.running_mean.numpy(), rtol=1e-5, atol=1e-7)


def test_conv1d_layout_rule():
    torch_conv = torch.nn.Sequential(torch.nn.Conv1d(4, 6, 3, padding=1))
    cell = nn.SequentialCell([nn.Conv1d(4, 6, 3, pad_mode="pad", padding=1, has_bias=True)])
    report = convert_state_dict(torch_conv, cell)
    assert [p.transform for p in report.placed if p.torch_name == "0.weight"] == ["reshape (6, 4, 3) -> (6, 4, 1, 3)"]
    assert_same_outputs(cell, torch_conv, torch.randn(2, 4, 10))


class WrongCell(nn.Cell):
    """Like the MLP of the tests, but fc2 is missing, fc1 is transposed, and extra has no torch twin."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(32, 16)
        self.extra = nn.Dense(2, 2)


def test_every_misfit_is_named():
    torch_model = torch.nn.Module()
    torch_model.fc1 = torch.nn.Linear(16, 32)
    torch_model.fc2 = torch.nn.Linear(32, 8)
    cell = WrongCell()
    before = cell.fc1.bias.asnumpy().copy()
    with pytest.raises(StateDictMismatchError) as info:
        convert_state_dict(torch_model, cell)
    err = info.value
    assert err.unplaced == ["fc2.weight (tried fc2.weight, fc2.gamma, fc2.embedding_table)",
                            "fc2.bias (tried fc2.bias, fc2.beta)"]
    assert err.mismatched == ["fc1.weight (32, 16) -> fc1.weight (16, 32) (transposed it would fit: the Cell keeps "
                              "this weight in another layout)", "fc1.bias (32,) -> fc1.bias (16,)"]
    assert err.missing == ["extra.bias", "extra.weight", "fc1.bias", "fc1.weight"]
    assert "fc2.weight" in str(err) and "extra.weight" in str(err)
    np.testing.assert_array_equal(cell.fc1.bias.asnumpy(), before)  # nothing loaded


def test_ambiguous_name_is_refused():
    class Both(nn.Cell):
        def __init__(self):
            super().__init__()
            self.norm = nn.Cell()
            self.norm.gamma = ms.Parameter(ms.Tensor(np.ones(4, np.float32)), name="gamma")
            self.norm.embedding_table = ms.Parameter(ms.Tensor(np.ones(4, np.float32)), name="embedding_table")

    with pytest.raises(StateDictMismatchError, match="norm.weight: ambiguous, the Cell has norm.gamma, "
                                                     "norm.embedding_table"):
        convert_state_dict({"norm.weight": torch.ones(4)}, Both())


def test_bad_state_dict_type():
    with pytest.raises(TypeError, match="state_dict: expected a mapping"):
        convert_state_dict([("a", torch.ones(1))], nn.Dense(1, 1))
