"""Code the generated Cell modules contain: containers mirroring torch modules, and MindSpore
compositions of torch functions that have no single MindSpore op with a CPU kernel.

The code generator copies the source of each helper a generated module uses into that module, so
the written file needs only MindSpore and NumPy. Each helper is checked against torch in
tests/migrate.
"""
import math

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, mint, nn, ops

__all__ = ["Module", "param", "scaled_dot_product_attention", "layer_norm", "in_float64_on_cpu", "InFloat64OnCpu",
           "exact_log1p", "diff", "PaddingEmbedding",
           "padded_embedding", "repeat_interleave", "slice_dim", "strided_scatter", "scatter_reduce", "einsum",
           "selective_scan", "Unrunnable", "HELPERS"]


class Module(nn.Cell):
    """A container mirroring one torch module: its sub-Cells and Parameters under their torch names."""

    def __init__(self, /, **members):
        super().__init__()
        for name, member in members.items():
            setattr(self, name, member)


def param(shape, dtype=ms.float32, requires_grad=True):
    """A zero-filled Parameter of `shape`; the checkpoint fills in the torch values."""
    return Parameter(Tensor(np.zeros(shape), dtype), requires_grad=requires_grad)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """torch.nn.functional.scaled_dot_product_attention (boolean masks keep True positions)."""
    length, source = query.shape[-2], key.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    scores = mint.mul(mint.matmul(query, mint.transpose(key, -2, -1)), scale)
    if is_causal:
        keep = Tensor(np.tril(np.ones((length, source), np.bool_)))
        scores = ops.masked_fill(scores, mint.logical_not(keep), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == ms.bool_:
            scores = ops.masked_fill(scores, mint.logical_not(attn_mask), float("-inf"))
        else:
            scores = mint.add(scores, attn_mask)
    probs = mint.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        probs = ops.dropout(probs, p=dropout_p, training=True)
    return mint.matmul(probs, value)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm over the last len(normalized_shape) dimensions."""
    axis = -len(normalized_shape)
    if weight is None:
        weight = mint.ones(tuple(normalized_shape), dtype=x.dtype)
    if bias is None:
        bias = mint.zeros(tuple(normalized_shape), dtype=x.dtype)
    return ops.LayerNorm(begin_norm_axis=axis, begin_params_axis=axis, epsilon=eps)(x, weight, bias)[0]


def in_float64_on_cpu(fn, x, *args, **kwargs):
    """`fn(x, *args, **kwargs)`; on the CPU a float32 `x` is computed in float64 and rounded once: MindSpore
    2.10's CPU float32 tanh is up to 1e-4 from exact (torch's 3e-8), its float64 kernel within float32's
    rounding (migrate.mappings.common.in_float64). Other dtypes and devices: the kernel as is. (Helpers are
    copied into generated files by name, one by one: InFloat64OnCpu repeats the test.)"""
    if x.dtype == ms.float32 and ms.get_context("device_target") == "CPU":
        return ops.cast(fn(ops.cast(x, ms.float64), *args, **kwargs), ms.float32)
    return fn(x, *args, **kwargs)


class InFloat64OnCpu(nn.Cell):
    """An activation Cell (nn.Tanh) run as `in_float64_on_cpu` runs a function."""

    def __init__(self, activation):
        super().__init__()
        self.activation = activation

    def construct(self, x):
        if x.dtype == ms.float32 and ms.get_context("device_target") == "CPU":
            return ops.cast(self.activation(ops.cast(x, ms.float64)), ms.float32)
        return self.activation(x)


def exact_log1p(x):
    """torch.log1p. MindSpore 2.10's CPU log1p is log(1 + x) for every x (log1p(1e-9) = 0 in float32, 1e-3
    relative off at x = e^-30 in float64). On the CPU float32 and float64 are computed in float64 as
    x (1 - x (1/2 - x/3)) for |x| < 1e-5 (the series' next term is x^4/4, relative <= x^3/4 = 2.5e-16) and
    log(1 + x) elsewhere (1 + x rounds by 1.1e-16, relative <= 1.1e-11 of log1p(x) there), and rounded once;
    other devices' kernels as they are."""
    if x.dtype not in (ms.float32, ms.float64) or ms.get_context("device_target") != "CPU":
        return mint.log1p(x)
    y = ops.cast(x, ms.float64)
    series = mint.mul(y, mint.sub(1.0, mint.mul(y, mint.sub(0.5, mint.div(y, 3.0)))))
    return ops.cast(mint.where(mint.lt(mint.abs(y), 1e-5), series, mint.log(mint.add(y, 1.0))), x.dtype)


class PaddingEmbedding(nn.Embedding):
    """nn.Embedding with torch's padding_idx: that row gets no gradient (MindSpore's only starts it at zero)."""

    def construct(self, ids):
        keep = ops.cast(mint.ne(ops.arange(0, self.vocab_size), self.padding_idx), self.embedding_table.dtype)
        keep = mint.reshape(keep, (-1, 1))
        table = mint.add(mint.mul(self.embedding_table, keep),
                         mint.mul(ops.stop_gradient(self.embedding_table), mint.sub(1, keep)))
        return ops.gather(table, ids, 0)


def padded_embedding(weight, ids, padding_idx):
    """torch's functional embedding with padding_idx: the rows of `ids`; row `padding_idx` gets no gradient."""
    keep = ops.cast(mint.ne(ops.arange(0, weight.shape[0]), padding_idx), weight.dtype)
    keep = mint.reshape(keep, (-1, 1))
    table = mint.add(mint.mul(weight, keep), mint.mul(ops.stop_gradient(weight), mint.sub(1, keep)))
    return ops.gather(table, ids, 0)


def repeat_interleave(x, repeats, dim=None):
    """torch.repeat_interleave with a whole number of repeats: each element `repeats` times along `dim`."""
    if dim is None:
        x, dim = mint.flatten(x), 0
    dim = dim % x.ndim
    shape = list(x.shape)
    expanded = mint.broadcast_to(mint.unsqueeze(x, dim + 1), tuple(shape[:dim + 1] + [repeats] + shape[dim + 1:]))
    return mint.reshape(expanded, tuple(shape[:dim] + [shape[dim] * repeats] + shape[dim + 1:]))


def diff(x, n=1, dim=-1, prepend=None, append=None):
    """torch.diff: the n-th forward difference along `dim`, after concatenating prepend/append."""
    if prepend is not None:
        x = mint.cat([prepend, x], dim)
    if append is not None:
        x = mint.cat([x, append], dim)
    for _ in range(n):
        length = x.shape[dim]
        x = mint.sub(mint.narrow(x, dim, 1, length - 1), mint.narrow(x, dim, 0, length - 1))
    return x


def slice_dim(x, dim, start, stop, step=1):
    """x[:, ..., start:stop:step] at dimension `dim` (>= 0), clipped as Python and torch clip. An empty result is
    made as zeros of its shape (it passes no gradient, as in torch): MindSpore 2.10's CPU StridedSliceGrad fails
    ("input memory out of bounds") on an empty slice (DeepSeek-V4's `kv[:, :usable]`, usable 0 below 128
    tokens). Generated where the slice was empty on the example inputs."""
    begin, end, stride = slice(start, stop, step).indices(x.shape[dim])
    if len(range(begin, end, stride)) == 0:
        shape = list(x.shape)
        shape[dim] = 0
        return mint.zeros(tuple(shape), dtype=x.dtype)
    return x[(slice(None),) * dim + (slice(begin, end, stride),)]


def strided_scatter(x, src, dim, start, stop, step):
    """torch.slice_scatter with a step: x with x[:, ..., start:stop:step] (at dimension `dim` >= 0) replaced by
    src, clipped as Python and torch clip (`x[..., 1:n:3] = y`: Qwen3.5's interleaved rotary sections). Every
    position of the dimension takes its src slice (a gather; positions outside the slice read slice 0) and a mask
    keeps x's own value outside the slice, so the gradient reaches src and x's kept positions exactly as in torch."""
    n = x.shape[dim]
    positions = np.arange(n)[slice(start, stop, step)]
    if positions.size == 0:
        return x
    keep = np.ones(n, np.bool_)
    keep[positions] = False
    source = np.zeros(n, np.int32)
    source[positions] = np.arange(positions.size, dtype=np.int32)
    shape = [1] * x.ndim
    shape[dim] = n
    return mint.where(Tensor(keep.reshape(shape)), x, ops.gather(src, Tensor(source), dim))


def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    """torch.scatter_reduce for reduce "sum", "mean" (floating dtypes), "amax" or "amin": every element of src
    (read where index has elements) reduced into x at its own position with dimension `dim` replaced by its index;
    positions no index names keep x. Segment reductions over x's flattened positions (TAPAS's segment minimum).
    The gradient is torch's: for amax/amin split evenly among the elements equal to the result (x's counted among
    them even without include_self, where its own share is dropped, as torch does), a result that is not finite
    passing none."""
    dim = dim % x.ndim
    if tuple(src.shape) != tuple(index.shape):
        src = src[tuple(slice(0, n) for n in index.shape)]
    strides = [int(np.prod(x.shape[d + 1:])) for d in range(x.ndim)]
    coords = np.indices(tuple(index.shape))
    base = np.zeros(tuple(index.shape), np.int32)  # each element's flat position in x, but for dimension `dim`
    for d in range(x.ndim):
        if d != dim:
            base += (coords[d] * strides[d]).astype(np.int32)
    flat = mint.reshape(mint.add(Tensor(base), mint.mul(ops.cast(index, ms.int32), strides[dim])), (-1,))
    values = mint.reshape(src, (-1,))
    size = int(np.prod(x.shape))
    own = mint.reshape(x, (-1,))
    count = ops.unsorted_segment_sum(mint.ones(values.shape, dtype=x.dtype), flat, size)
    hit = mint.gt(count, 0)
    if reduce in ("sum", "mean"):
        total = ops.unsorted_segment_sum(values, flat, size)
        if include_self:
            total, count = mint.add(total, own), mint.add(count, 1)
        if reduce == "mean":
            total = mint.div(total, mint.where(hit, count, ops.ones_like(count)))
        return mint.reshape(mint.where(hit, total, own), x.shape)
    segment = ops.unsorted_segment_max if reduce == "amax" else ops.unsorted_segment_min
    best = segment(values, flat, size)
    if include_self:
        best = mint.maximum(best, own) if reduce == "amax" else mint.minimum(best, own)
    result = ops.stop_gradient(mint.where(hit, best, own))
    if not x.is_floating_point():
        return mint.reshape(result, x.shape)
    chosen = ops.cast(mint.eq(values, ops.gather(result, flat, 0)), x.dtype)
    kept = ops.cast(mint.eq(own, result), x.dtype)
    ties = mint.add(kept, ops.unsorted_segment_sum(chosen, flat, size))  # x counted even without include_self, as torch
    if not include_self:
        kept = mint.mul(kept, ops.cast(mint.logical_not(hit), x.dtype))
    carrier = mint.div(mint.add(mint.mul(own, kept), ops.unsorted_segment_sum(mint.mul(values, chosen), flat, size)),
                       ties)
    delta = mint.sub(carrier, ops.stop_gradient(carrier))  # zero, with the gradient of the tied elements' mean
    delta = mint.where(mint.isfinite(carrier), delta, ops.zeros_like(delta))
    return mint.reshape(mint.add(result, delta), x.shape)


def einsum(equation, *operands):
    """torch.einsum for an explicit equation (`bij,bjk->bik`: letters only, `->` given, no letter twice in one
    operand; the converter writes the ellipsis and an implicit output out as letters), as sums, transposes,
    broadcasts, reshapes and batched matrix products: MindSpore's einsum has no CPU kernel. Operands are contracted
    left to right; a letter no later operand and not the output has is summed as early as possible. Equal to
    torch up to the order of the float sums. Letters of size 1 broadcast against the other operand's, as in torch."""
    terms, output = equation.split("->")
    terms = terms.split(",")

    def sum_out(x, letters, keep):
        dims = tuple(i for i, c in enumerate(letters) if c not in keep)
        if not dims:
            return x, letters
        return mint.sum(x, dim=dims), "".join(c for c in letters if c in keep)

    def arrange(x, letters, order, sizes):
        if list(letters) != list(order):
            x = mint.permute(x, tuple(letters.index(c) for c in order))
        target = tuple(sizes[c] for c in order)
        return x if tuple(x.shape) == target else mint.broadcast_to(x, target)

    x, letters = operands[0], terms[0]
    for k in range(1, len(terms)):
        needed = set(output).union(*terms[k + 1:])
        y, other = operands[k], terms[k]
        x, letters = sum_out(x, letters, needed | set(other))
        y, other = sum_out(y, other, needed | set(letters))
        sizes = {}
        for t, lets in ((x, letters), (y, other)):
            for c, n in zip(lets, t.shape):
                if sizes.get(c, 1) == 1:
                    sizes[c] = n
                elif n not in (1, sizes[c]):
                    raise ValueError(f"einsum {equation}: letter {c!r} has sizes {sizes[c]} and {n}")
        batch = [c for c in letters if c in other and c in needed]
        summed = [c for c in letters if c in other and c not in needed]
        free_x = [c for c in letters if c not in other]
        free_y = [c for c in other if c not in letters]
        count = lambda group: math.prod(sizes[c] for c in group)  # noqa: E731
        a = mint.reshape(arrange(x, letters, batch + free_x + summed, sizes),
                         (count(batch), count(free_x), count(summed)))
        b = mint.reshape(arrange(y, other, batch + summed + free_y, sizes),
                         (count(batch), count(summed), count(free_y)))
        x = mint.reshape(mint.bmm(a, b), tuple(sizes[c] for c in batch + free_x + free_y))
        letters = "".join(batch + free_x + free_y)
    x, letters = sum_out(x, letters, set(output))
    if letters != output:
        x = mint.permute(x, tuple(letters.index(c) for c in output))
    return x


def selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """transformers' reference Mamba selective scan, looping over the run-time length (so the Cell stays
    shape-general): hidden_states, dt, z (batch, channels, length), A (channels, state), B, C (batch, state,
    length), D, delta_bias (channels). The same operations in the same order as torch's recurrent branch."""
    batch, channels, length = hidden_states.shape
    if delta_bias is not None:
        dt = mint.add(dt, mint.unsqueeze(delta_bias, -1))
    if delta_softplus:
        dt = ops.softplus(dt, 1.0, 20.0)
    B, C = mint.transpose(B, 1, 2), mint.transpose(C, 1, 2)
    discrete_A = mint.exp(mint.mul(A[None, :, None, :], dt[:, :, :, None]))
    delta_b_u = mint.mul(mint.mul(dt[:, :, :, None], B[:, None, :, :]), hidden_states[:, :, :, None])
    state = mint.zeros((batch, channels, A.shape[-1]), dtype=hidden_states.dtype)
    outputs = []
    for index in range(length):
        state = mint.add(mint.mul(discrete_A[:, :, index], state), delta_b_u[:, :, index])
        outputs.append(mint.matmul(state, mint.unsqueeze(C[:, index, :], -1))[:, :, 0])
    out = ops.stack(outputs, -1)
    if D is not None:
        out = mint.add(out, mint.mul(hidden_states, D[None, :, None]))
    if z is not None:
        out = mint.mul(out, mint.nn.functional.silu(z))
    return out


class Unrunnable(nn.Cell):
    """A layer torch builds but cannot run (an AvgPool2d of kernel 0, Gemma 3's image pooling under a small
    config: torch raises when it is called); calling it raises the same way, so a model that never calls it
    converts and one that does fails as in torch."""

    def __init__(self, reason):
        super().__init__()
        self.reason = reason

    def construct(self, *args):
        raise RuntimeError(self.reason)


HELPERS = {"Module": Module, "param": param, "scaled_dot_product_attention": scaled_dot_product_attention,
           "layer_norm": layer_norm, "in_float64_on_cpu": in_float64_on_cpu,
           "InFloat64OnCpu": InFloat64OnCpu, "exact_log1p": exact_log1p, "diff": diff, "PaddingEmbedding": PaddingEmbedding,
           "padded_embedding": padded_embedding, "repeat_interleave": repeat_interleave, "slice_dim": slice_dim,
           "strided_scatter": strided_scatter, "scatter_reduce": scatter_reduce, "einsum": einsum,
           "selective_scan": selective_scan, "Unrunnable": Unrunnable}
