"""A buffer the torch forward replaces by a larger one (Wav2Vec2-Conformer's relative positional table, extended for a
longer input): running torch inside `preserved_buffers` (the conversion's check and the sweep's comparison at a second
shape) leaves the model with its buffers as before, same shapes and values, instead of failing to copy the larger
table into the smaller."""
import pytest
import torch

from mindspore_hyper.migrate.lowering import preserved_buffers


class _GrowingTable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(4.0))
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        if x.shape[-1] > self.table.shape[0]:
            self.table = torch.arange(float(x.shape[-1]))  # replaced, as extend_pe does
        self.count += 1  # updated in place, as BatchNorm's statistics
        return x + self.table[:x.shape[-1]]


@pytest.mark.parametrize("nested", [False, True])
def test_replaced_buffer_is_put_back(nested):
    model = torch.nn.Sequential(_GrowingTable()) if nested else _GrowingTable()
    inner = model[0] if nested else model
    with preserved_buffers(model):
        out = model(torch.zeros(2, 7))
    assert out[0].tolist() == list(range(7))  # the forward did grow the table
    assert inner.table.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert float(inner.count) == 0.0
    assert dict(model.named_buffers()).keys() == {f"{'0.' if nested else ''}{n}" for n in ("table", "count")}
