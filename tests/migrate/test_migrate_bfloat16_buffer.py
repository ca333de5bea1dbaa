"""A model with a bfloat16 buffer (RecurrentGemma's `normalizer`, cast to the activations' dtype where read)
converts and its check runs: the check's snapshot of the Cell's non-trained parameters went through
`Parameter.value()`, MindSpore's CPU Identity, which has no bfloat16 kernel ("Select CPU operator[Identity] fail")."""
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert

from migrate_models import TOL, assert_same_outputs


class ScaledByBfloat16Buffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)
        self.register_buffer("normalizer", torch.tensor(4 ** 0.5, dtype=torch.bfloat16), persistent=False)

    def forward(self, x):
        return self.proj(x) * self.normalizer.type(x.dtype)


def test_a_bfloat16_buffer_converts_and_is_kept_bfloat16():
    """Tolerance TOL (1e-5): a length-4 dot product and a product by 2 (exact in bfloat16), float32 on both sides."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    model = ScaledByBfloat16Buffer()
    cell, report = convert(model, torch.randn(2, 5, 4))
    assert report.check["max_relative_error"] <= TOL
    assert_same_outputs(cell, model, torch.randn(3, 7, 4))
    buffers = [p for p in cell.get_parameters() if p.dtype == ms.bfloat16]
    assert len(buffers) == 1 and float(buffers[0].astype(ms.float32).asnumpy()) == 2.0
