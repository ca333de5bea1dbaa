"""Writes into parts of a tensor the sweep's families need: a strided slice assignment (`x[..., 1:n:3] = y`,
Qwen3.5's interleaved rotary sections: aten.slice_scatter with a step), scatter_reduce (TAPAS's segment minimum)
and empty_like written before it is read (PhiMoE's router). Each converted, then compared with torch at a second
shape, values and the gradients of every floating input."""
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.compare import relative_error, to_mindspore
from mindspore_hyper.migrate.errors import UnsupportedOpError

pytestmark = pytest.mark.usefixtures("pynative")

# Small-integer inputs make sums, maxima and minima exact in float32 on both sides; the only rounding is one
# division (a mean, or a gradient split among tied elements): half an ulp, 6e-8 relative. 1e-6 allows that with
# margin, while a misplaced or missing element is off by O(1).
EXACT_TOL = 1e-6


def _compare(model, first, second, weight, grad_inputs):
    """Convert at `first`; at `second` the outputs and the gradients of sum(output * weight) with respect to the
    inputs at positions `grad_inputs` agree with torch. Returns (output error, gradient error)."""
    cell, _ = convert(model, first)
    leaves = [x.clone().requires_grad_(i in grad_inputs) for i, x in enumerate(second)]
    want = model(*leaves)
    (want * weight).sum().backward()
    ms_inputs = [to_mindspore(x) for x in second]
    got = cell(*ms_inputs)
    grads = ms.grad(lambda *xs: (cell(*xs) * to_mindspore(weight)).sum(), grad_position=tuple(grad_inputs))(*ms_inputs)
    grads = grads if isinstance(grads, tuple) else (grads,)
    out_error = relative_error([got.asnumpy()], [want.detach().numpy()])
    grad_error = relative_error([g.asnumpy() for g in grads], [leaves[i].grad.numpy() for i in grad_inputs])
    return out_error, grad_error


class _Interleaved(torch.nn.Module):
    """Qwen3.5's recomposition of rotary frequencies: every third position from offset 1 taken from another part."""

    def forward(self, x, y):
        mixed = x * 1
        mixed[..., 1:x.shape[-1]:3] = y[..., 1::3] * 2
        mixed[..., 2::3] = y[..., 2::3] - 1  # stop at the end: aten.slice_scatter's end is int64 max
        return torch.cat((mixed, mixed), dim=-1)


def test_strided_slice_assignment_equals_torch_with_gradients_to_both_parts():
    """Converted at last dimension 7, compared at 10 (other counts of written positions); the gradient reaches x's
    kept positions (x's written ones get none) and y's read ones. Values are copies, products by 2 and sums with
    -1 of float32 numbers: one rounding each, 1e-6."""
    g = torch.Generator().manual_seed(0)
    first = (torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g))
    second = (torch.randn(3, 2, 10, generator=g), torch.randn(3, 2, 10, generator=g))
    weight = torch.randn(3, 2, 20, generator=g)
    out_error, grad_error = _compare(_Interleaved(), first, second, weight, (0, 1))
    assert out_error <= EXACT_TOL and grad_error <= EXACT_TOL


class _ScatterReduce(torch.nn.Module):
    def __init__(self, reduce, include_self):
        super().__init__()
        self.reduce, self.include_self = reduce, include_self

    def forward(self, x, src, index):
        return x.scatter_reduce(1, index, src, self.reduce, include_self=self.include_self)


def _segments(g, batch, rows, picked, extra=0):
    """x (batch, rows, 3) and src (batch, picked + extra, 3) of small integers (ties in every reduction), index
    (batch, picked, 3) into rows 0 .. rows - 2 (the last row is never written: it keeps x)."""
    x = torch.randint(-2, 3, (batch, rows, 3), generator=g).float()
    src = torch.randint(-2, 3, (batch, picked + extra, 3), generator=g).float()
    return x, src, torch.randint(0, rows - 1, (batch, picked, 3), generator=g)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_scatter_reduce_equals_torch_with_gradients(reduce, include_self):
    """Gradients as torch's: for amax/amin split evenly among the tied elements."""
    g = torch.Generator().manual_seed(1)
    model = _ScatterReduce(reduce, include_self)
    second = _segments(g, 3, 6, 8)
    out_error, grad_error = _compare(model, _segments(g, 2, 5, 4), second, torch.randn(3, 6, 3, generator=g), (0, 1))
    assert out_error <= EXACT_TOL and grad_error <= EXACT_TOL


def test_scatter_reduce_reads_src_only_where_index_is():
    """torch reads src[:, :picked] when src is longer than the index (TAPAS's flattened values are not)."""
    g = torch.Generator().manual_seed(2)
    model = _ScatterReduce("amin", False)
    cell, _ = convert(model, _segments(g, 2, 5, 4, extra=2))
    second = _segments(g, 3, 6, 8, extra=3)
    got = cell(*[to_mindspore(x) for x in second]).asnumpy()
    assert relative_error([got], [model(*second).numpy()]) <= EXACT_TOL


def test_scatter_reduce_prod_is_refused_by_name():
    g = torch.Generator().manual_seed(3)
    with pytest.raises(UnsupportedOpError, match=r"scatter_reduce\(reduce='prod'\) is not mapped \(supported: "
                                                 r"'sum', 'mean', 'amax', 'amin'\)"):
        convert(_ScatterReduce("prod", True), _segments(g, 2, 5, 4))


def test_scatter_reduce_integer_mean_is_refused():
    x = torch.zeros(2, 4, dtype=torch.int64)
    index = torch.tensor([[0, 0, 1], [2, 2, 3]])
    with pytest.raises(UnsupportedOpError, match=r"reduce='mean'\) on torch.int64 .* not mapped"):
        convert(_ScatterReduce("mean", True), (x, index * 3, index))


class _WrittenEmpty(torch.nn.Module):
    """PhiMoE's pattern: a tensor made by empty_like and filled before any read."""

    def forward(self, x):
        fresh = torch.empty_like(x)
        fresh.copy_(x * 3)
        return fresh + x


def test_empty_like_written_before_read_equals_torch():
    """3x + x: two roundings of float32, 1e-6."""
    g = torch.Generator().manual_seed(4)
    second = (torch.randn(4, 9, generator=g),)
    out_error, grad_error = _compare(_WrittenEmpty(), (torch.randn(2, 5, generator=g),), second,
                                     torch.randn(4, 9, generator=g), (0,))
    assert out_error <= EXACT_TOL and grad_error <= EXACT_TOL
