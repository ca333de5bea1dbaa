"""Experts over rows sorted by expert (sorted_experts.py): JetMoE's MoE block, whose router reads its experts'
sizes back to Python, converted shape-generally and checked against torch at a second shape and in training;
a router that computes something else is left as written and refused by its op; and the two ops the block
needed, `index_add` and `div(rounding_mode="trunc")`, against torch."""
import numpy as np
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.errors import UnsupportedOpError

from migrate_models import assert_same_outputs
from migrate_training import train_both


class _Layer(torch.nn.Module):
    """The block inside a model, as in JetMoE's decoder layer (the converted root keeps no sizes of its own)."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x)


def _jetmoe_block():
    from transformers import JetMoeConfig
    from transformers.models.jetmoe.modeling_jetmoe import JetMoeMoE

    torch.manual_seed(0)
    config = JetMoeConfig(hidden_size=16, intermediate_size=8, num_local_experts=4, num_experts_per_tok=2)
    block = JetMoeMoE(config)
    with torch.no_grad():
        block.bias.normal_()  # torch.empty in the constructor
        for experts in (block.input_linear, block.output_linear):
            experts.weight.normal_(std=0.3)
    return block


def test_jetmoe_block_matches_torch_at_a_second_shape_and_in_training():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    block = _Layer(_jetmoe_block())
    cell, report = convert(block, torch.randn(2, 5, 16))
    assert any("expert sizes kept a tensor" in n for n in report.notes), report.notes
    # float32; every output sums <= 16 products per expert and 2 experts: within ~20 u of exact on either side,
    # far inside the default 1e-5 relative. A row routed to the wrong expert is off by O(1).
    assert_same_outputs(cell, block, torch.randn(3, 7, 16))
    batches = [(torch.randn(2, 5, 16),), (torch.randn(3, 7, 16),), (torch.randn(1, 4, 16),)]
    # the routing is piecewise constant, so equal weights give equal choices; losses as the forward
    want, got = train_both(block, cell, batches, lambda out, b: (out ** 2).mean(), lambda out, b: (out ** 2).mean())
    assert np.allclose(got, want, rtol=1e-5, atol=0)


def test_a_router_that_differs_is_left_as_written_and_refused_by_its_op():
    from transformers.models.jetmoe import modeling_jetmoe

    class JetMoeTopKGating(modeling_jetmoe.JetMoeTopKGating):  # same name, other routing: its gates doubled
        def forward(self, hidden_states):
            out = list(super().forward(hidden_states))
            out[2] = out[2] * 2
            return tuple(out)

    block = _jetmoe_block()
    block.router = JetMoeTopKGating(16, 4, 2)
    with pytest.raises(UnsupportedOpError, match="aten.item") as info:
        convert(_Layer(block), torch.randn(2, 5, 16))
    assert any("left as written" in n and "other routing outputs" in n for n in info.value.report.notes)


class _IndexAdd(torch.nn.Module):
    def forward(self, x, src):
        rows = torch.tensor([2, 0, 2])
        return x.index_add(0, rows, src) + torch.zeros(3, 4).index_add(1, torch.tensor([3, 1]), x[:, :2], alpha=2)


class _TruncDivide(torch.nn.Module):
    def forward(self, ints, floats):
        return (torch.div(ints, 3, rounding_mode="trunc"), torch.div(ints, -ints.abs() - 1, rounding_mode="trunc"),
                torch.div(floats, 0.7, rounding_mode="trunc"))


def test_index_add_and_trunc_division_match_torch():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, src = torch.randn(3, 4), torch.randn(3, 4)
    cell, _ = convert(_IndexAdd(), (x, src))
    want = _IndexAdd()(x, src).numpy()
    # every output is a sum of at most 4 terms (x, two rows of src, 2 x a column of x), added in another order
    # than torch's (the rows summed first, then added): each side within 3u of the sum of |terms|, so 6u apart
    u = np.finfo(np.float32).eps / 2
    magnitude = _IndexAdd()(x.abs(), src.abs()).numpy()
    first = cell(ms.Tensor(x.numpy()), ms.Tensor(src.numpy())).asnumpy()
    assert np.all(np.abs(first - want) <= 6 * u * magnitude)
    again = cell(ms.Tensor(x.numpy()), ms.Tensor(src.numpy())).asnumpy()
    assert np.array_equal(again, first)  # the input is not written (mint.index_add's CPU kernel writes it)
    ints, floats = torch.arange(-7, 8).reshape(3, 5), torch.linspace(-3, 3, 15).reshape(3, 5)
    cell, _ = convert(_TruncDivide(), (ints, floats))
    got = [t.asnumpy() for t in cell(ms.Tensor(ints.numpy()), ms.Tensor(floats.numpy()))]
    for g, w in zip(got, _TruncDivide()(ints, floats)):
        assert g.dtype == w.numpy().dtype and np.array_equal(g, w.numpy())  # exact: integer or one rounded quotient
