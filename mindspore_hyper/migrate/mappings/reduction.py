"""Reductions and scans: sum, mean, amax/amin, max/min, argmax, cumsum, var/std, prod, any/all."""
import torch

from mindspore_hyper.migrate.mappings.common import call, ms_dtype
from mindspore_hyper.migrate.mappings.registry import Unsupported, function, method

aten = torch.ops.aten


def _dims(dim):
    """None (all dimensions) or a tuple of dimensions from an int / list argument."""
    value = dim.const("dim")
    if value is None or value == []:
        return None
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _reduce(fn: str, self, dim, keepdim, **extra) -> str:
    """fn over `dim` (all dimensions when None; mint reductions take no keepdim without a dim)."""
    dims = _dims(dim)
    if dims is None and not keepdim.value:
        return call(fn, self, **extra)
    if dims is None:
        dims = tuple(range(self.ndim))
    return call(fn, self, dim=dims, keepdim=keepdim, **extra)


def _dtype(dtype):
    return None if dtype.value is None else ms_dtype(dtype.value)


@function("mint.sum", aten.sum, torch.sum, method("sum"))
def sum_(self, dim=None, keepdim=False, dtype=None):
    return _reduce("mint.sum", self, dim, keepdim, dtype=_dtype(dtype))


@function("mint.mean", aten.mean, torch.mean, method("mean"))
def mean(self, dim=None, keepdim=False, dtype=None):
    return _reduce("mint.mean", self, dim, keepdim, dtype=_dtype(dtype))


@function("mint.prod", aten.prod, torch.prod, method("prod"))
def prod(self, dim=None, keepdim=False, dtype=None):
    return _reduce("mint.prod", self, dim, keepdim, dtype=_dtype(dtype))


def _amax_amin(fn: str):
    def emit(self, dim=(), keepdim=False):
        dims = _dims(dim)
        return call(fn, self, dim=tuple(range(self.ndim)) if dims is None else dims, keepdim=keepdim)
    return emit


function("mint.amax", aten.amax, torch.amax, method("amax"))(_amax_amin("mint.amax"))
function("mint.amin", aten.amin, torch.amin, method("amin"))(_amax_amin("mint.amin"))


def _max_min(fn: str, pairwise: str):
    def emit(self, dim=None, keepdim=False, other=None):
        if other is not None and other.is_tensor or dim is not None and dim.is_tensor:
            return call(pairwise, self, other if other is not None and other.is_tensor else dim)
        if dim is None or dim.value is None:
            return call(fn, self)
        return call(fn, self, dim=dim, keepdim=keepdim)  # (values, indices)
    return emit


function("mint.max", aten.max, torch.max, method("max"))(_max_min("mint.max", "mint.maximum"))
function("mint.min", aten.min, torch.min, method("min"))(_max_min("mint.min", "mint.minimum"))


@function("ops.argmax", aten.argmax, torch.argmax, method("argmax"))
def argmax(self, dim=None, keepdim=False):
    # mint.argmax has no CPU kernel.
    return call("ops.argmax", self, dim=dim, keepdim=keepdim)


@function("ops.cumsum", aten.cumsum, torch.cumsum, method("cumsum"))
def cumsum(self, dim, dtype=None):
    if self.dtype == torch.bool and dtype.value is None:  # torch sums booleans as int64
        return call("ops.cumsum", call("ops.cast", self, "ms.int64"), dim)
    return call("ops.cumsum", self, dim, dtype=_dtype(dtype))


def _var_std(fn: str):
    def emit(self, dim=None, unbiased=None, keepdim=False, correction=None):
        if correction is not None and correction.value is not None:
            ddof = correction.const("correction")
        else:
            ddof = 1 if unbiased is None or unbiased.value in (None, True) else 0
        return call(fn, self, axis=_dims(dim), ddof=ddof, keepdims=keepdim)
    return emit


function("ops.var", aten.var, torch.var, method("var"))(_var_std("ops.var"))
function("ops.std", aten.std, torch.std, method("std"))(_var_std("ops.std"))


def _any_all(fn: str):
    def emit(self, dim=None, keepdim=False):
        return _reduce(fn, self, dim, keepdim)
    return emit


function("mint.any", aten.any, torch.any, method("any"))(_any_all("mint.any"))
function("mint.all", aten.all, torch.all, method("all"))(_any_all("mint.all"))


@function("diff (helper)", aten.diff, torch.diff, method("diff"))
def diff(self, n=1, dim=-1, prepend=None, append=None):
    return call("diff", self, n, dim, prepend, append)


@function("repeat_interleave (helper)", aten.repeat_interleave, torch.repeat_interleave, method("repeat_interleave"))
def repeat_interleave(self, repeats, dim=None, output_size=None):
    if repeats.is_tensor:
        raise Unsupported("repeat_interleave with a tensor of repeats (a data-dependent size) is not mapped")
    return call("repeat_interleave", self, repeats, dim)


@function("ops.topk", aten.topk, torch.topk, method("topk"))
def topk(self, k, dim=-1, largest=True, sorted=True):
    # (values, indices); MindSpore's indices are int32, torch's int64: cast them
    return (f"(lambda values_indices: (values_indices[0], ops.cast(values_indices[1], ms.int64)))"
            f"({call('ops.topk', self, k, dim=dim, largest=largest, sorted=sorted)})")


@function("ops.sort", aten.sort, torch.sort, method("sort"))
def sort(self, dim=-1, descending=False, stable=None):
    # (values, indices); MindSpore's indices are int32, torch's int64: cast them. mint.sort has no CPU kernel.
    return (f"(lambda values_indices: (values_indices[0], ops.cast(values_indices[1], ms.int64)))"
            f"({call('ops.sort', self, dim, descending)})")


@function("ops.logsumexp", aten.logsumexp, torch.logsumexp, method("logsumexp"))
def logsumexp(self, dim, keepdim=False):
    # mint.logsumexp has no CPU kernel
    return call("ops.logsumexp", self, _dims(dim), keepdim)


@function("ops.norm", aten.linalg_vector_norm, torch.linalg.vector_norm,
          names=["aten.linalg_vector_norm", "torch.linalg.vector_norm"])
def vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None):
    # mint's LinalgVectorNorm has no CPU kernel
    if dtype.value is not None:
        raise Unsupported("linalg_vector_norm(dtype=...) is not mapped")
    dims = _dims(dim)
    if dims is None:  # every element: the norm of the flattened tensor (ops.norm of a matrix is a matrix norm)
        if keepdim.value:
            raise Unsupported("linalg_vector_norm over every dimension with keepdim=True is not mapped")
        return call("ops.norm", call("mint.reshape", self, "(-1,)"), ord)
    if isinstance(dims, tuple) and len(dims) > 1:  # ops.norm over two dimensions is a matrix norm
        raise Unsupported(f"linalg_vector_norm over several dimensions {dims} is not mapped (one, or all)")
    return call("ops.norm", self, ord, dims, keepdim)
