"""A mapped layer whose exported call also carries size arithmetic: export puts the arithmetic of a symbolic
shape (`1 + (h - 1) // 2` after a strided convolution) in the scope of the module whose output first has it, so
the BatchNorm after SwiftFormer's and CvT's strided convolutions receives the caller's sizes and returns them
computed beside its output. The port calls the layer on its tensor and computes the sizes in the caller."""
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.compare import relative_error, to_mindspore

pytestmark = pytest.mark.usefixtures("pynative")

# float32 on both sides (u = 6e-8): at the compared shape each output passes through length-n sums (convolutions
# n = 27 and 36, batch statistics over 3 * 8 * 6 = 144 and 3 * 4 * 3 = 36 elements, the linear layer n = 6, the
# mean n = 12), within gamma_n = n u of exact each (Higham 3.1): 261 u = 1.6e-5 for one side, 3.2e-5 for the
# difference; the backward pass runs the same sums again (6.4e-5). 1e-4 bounds both; a wrong size or statistic is
# off by O(1).
TOL = 1e-4


class _Embedding(torch.nn.Module):
    """SwiftFormer's embedding: a strided convolution, then BatchNorm."""

    def __init__(self, channels_in, channels_out):
        super().__init__()
        self.proj = torch.nn.Conv2d(channels_in, channels_out, 3, stride=2, padding=1)
        self.norm = torch.nn.BatchNorm2d(channels_out)

    def forward(self, x):
        return self.norm(self.proj(x))


class _Net(torch.nn.Module):
    """Two embeddings, then the positions read from the output's shape (the sizes export computes in the norm)."""

    def __init__(self):
        super().__init__()
        self.first, self.second = _Embedding(3, 4), _Embedding(4, 6)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        y = self.second(self.first(x))
        batch, channels, height, width = y.shape
        return self.head(y.reshape(batch, channels, height * width).transpose(1, 2)).mean(1)


def test_batchnorm_after_strided_convolution_converts_and_trains_as_torch():
    """Converted in training mode (batch statistics) at 8 x 8, compared at 16 x 12: the outputs and the input's
    gradient."""
    torch.manual_seed(0)
    model = _Net().train()
    cell, _ = convert(model, torch.randn(2, 3, 8, 8))
    x = torch.randn(3, 3, 16, 12, requires_grad=True)
    weight = torch.randn(3, 3)
    want = model(x)
    (want * weight).sum().backward()
    ms_x = to_mindspore(x.detach())
    got = cell(ms_x)
    grad = ms.grad(lambda v: (cell(v) * to_mindspore(weight)).sum())(ms_x)
    assert relative_error([got.asnumpy()], [want.detach().numpy()]) <= TOL
    assert relative_error([grad.asnumpy()], [x.grad.numpy()]) <= TOL
