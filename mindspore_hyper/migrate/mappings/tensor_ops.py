"""Shape, indexing, joining and dtype ops: view/reshape, permute, transpose, (un)squeeze, flatten,
expand, split/chunk/unbind, cat/stack, slicing and indexing, gather, masked_fill, where, repeat,
casts, sizes, and the no-ops (contiguous, clone, detach, assertions).

Generated code never updates a tensor in place (the in-place pass refuses the cases where that
would matter), so clone/contiguous/detach are aliases.
"""
import builtins
import operator

import torch

from mindspore_hyper.migrate.mappings.common import call, literal, ms_dtype, sizes, subscript
from mindspore_hyper.migrate.mappings.registry import (
    NO_VALUE, NOT_CONSTANT, Alias, Arg, Unsupported, function, method)

aten = torch.ops.aten
_INT64_MAX = 2 ** 63 - 1


# -- views and shapes --------------------------------------------------------------------------
@function("mint.reshape", aten.view, aten.reshape, torch.reshape)
def reshape(self, size=None, shape=None):
    target = shape if size is None or size.value is None else size
    if isinstance(target.value, torch.dtype):
        raise Unsupported("view(dtype) reinterprets bits; MindSpore has no bit-cast view")
    return call("mint.reshape", self, target)


@function("mint.reshape", method("view"), method("reshape"))
def reshape_method(self, *shape):
    return reshape(self, sizes(shape))


@function("mint.reshape", method("view_as"), method("reshape_as"), aten.view_as, aten.reshape_as)
def reshape_as(self, other):
    return call("mint.reshape", self, f"{other}.shape")


@function("mint.permute", aten.permute, torch.permute)
def permute(self, dims):
    return call("mint.permute", self, sizes([dims]))


@function("mint.permute", method("permute"))
def permute_method(self, *dims):
    return call("mint.permute", self, sizes(dims))


@function("mint.transpose", aten.transpose, torch.transpose, method("transpose"), torch.swapaxes,
          method("swapaxes"), aten.swapaxes)
def transpose(self, dim0=None, dim1=None, axis0=None, axis1=None):
    first, second = (dim0, dim1) if axis0.value is None else (axis0, axis1)
    return call("mint.transpose", self, first, second)


@function("mint.transpose", aten.t, torch.t, method("t"))
def t(self):
    return Alias(self) if self.ndim < 2 else call("mint.transpose", self, 0, 1)


@function("mint.permute (dimensions reversed)", aten.numpy_T)
def numpy_t(self):
    if self.ndim < 2:
        return Alias(self)
    return call("mint.permute", self, tuple(reversed(range(self.ndim))))


@function("mint.unsqueeze", aten.unsqueeze, torch.unsqueeze, method("unsqueeze"))
def unsqueeze(self, dim):
    return call("mint.unsqueeze", self, dim)


@function("mint.squeeze", aten.squeeze, torch.squeeze, method("squeeze"))
def squeeze(self, dim=None):
    if dim.value is None:
        return call("ops.squeeze", self)  # mint.squeeze needs dims
    dims = dim.const("dim")
    dims = tuple(dims) if isinstance(dims, (list, tuple)) else (dims,)
    # torch ignores dimensions that are not 1; mint.squeeze refuses them, so keep only the size-1 ones.
    shape = self.shape
    kept = tuple(d for d in dims if not shape or shape[d] == 1)
    return Alias(self) if not kept else call("mint.squeeze", self, kept)


@function("mint.flatten", aten.flatten, torch.flatten, method("flatten"))
def flatten(self, start_dim=0, end_dim=-1):
    return call("mint.flatten", self, start_dim, end_dim)


@function("mint.reshape (unflatten)", aten.unflatten, torch.unflatten, method("unflatten"))
def unflatten(self, dim, sizes):
    # one dimension split into `sizes` (one of them may be -1), the others kept: a reshape to the sizes before
    # it, the new ones and the sizes after it, read at run time (Qwen4-Exp's mixing weights)
    d = dim.const("dim") % self.ndim
    return call("mint.reshape", self, f"tuple({self}.shape[:{d}]) + tuple({sizes}) + tuple({self}.shape[{d + 1}:])")


@function("mint.broadcast_to", aten.expand)
def expand(self, size, implicit=False):
    return call("mint.broadcast_to", self, sizes([size]))


@function("mint.broadcast_to", method("expand"))
def expand_method(self, *sizes_):
    return call("mint.broadcast_to", self, sizes(sizes_))


@function("mint.broadcast_to", method("expand_as"), aten.expand_as)
def expand_as(self, other):
    return call("mint.broadcast_to", self, f"{other}.shape")


@function("(identity)", method("contiguous"), aten.contiguous, aten.clone, torch.clone, method("clone"), aten.alias)
def identity(self, memory_format=None):
    return Alias(self)


@function("ops.stop_gradient", aten.detach, method("detach"))
def detach(self):
    # the same values, no gradient through them (torch's detach, and the outputs of a torch.no_grad() region)
    return call("ops.stop_gradient", self) if self.is_tensor and self.dtype.is_floating_point else Alias(self)


# -- dtype ---------------------------------------------------------------------------------------
def _cast(self: Arg, dtype) -> object:
    if dtype is None or dtype == self.dtype:
        return Alias(self)
    return call("ops.cast", self, ms_dtype(dtype))


@function("ops.cast", aten.to)
def to_aten(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, copy=False,
            memory_format=None, other=None):
    target = other.dtype if other.is_tensor else dtype.const("dtype")
    return _cast(self, target)


@function("ops.cast", method("to"))
def to_method(self, *args, **kwargs):
    dtype = kwargs["dtype"].const("dtype") if "dtype" in kwargs else None
    for a in args:
        if isinstance(a.value, torch.dtype):
            dtype = a.value
        elif a.is_tensor:
            dtype = a.dtype
        elif not (isinstance(a.value, (str, torch.device)) or a.value is None or isinstance(a.example, torch.device)):
            raise Unsupported(f"Tensor.to({a.code}) is not mapped (expected a dtype, device or tensor)")
    return _cast(self, dtype)


@function("ops.cast", method("type"))
def type_method(self, dtype=None):
    if not isinstance(dtype.value, torch.dtype):
        raise Unsupported("Tensor.type() without a torch dtype is not mapped")
    return _cast(self, dtype.value)


@function("ops.cast", method("type_as"), aten.type_as)
def type_as(self, other):
    return _cast(self, other.dtype)


def _cast_method(dtype):
    def cast_to(self, memory_format=None):
        return _cast(self, dtype)
    return cast_to


for _name, _dtype in (("float", torch.float32), ("half", torch.float16), ("double", torch.float64),
                      ("int", torch.int32), ("long", torch.int64), ("bool", torch.bool),
                      ("bfloat16", torch.bfloat16)):
    function("ops.cast", method(_name))(_cast_method(_dtype))


# -- splitting and joining --------------------------------------------------------------------
@function("ops.split", aten.split, aten.split_with_sizes, torch.split, method("split"))
def split(self, split_size=None, dim=0, split_sizes=None, split_size_or_sections=None):
    # Not mint.split: on CPU its gradient is wrong when the pieces go through reshape/transpose
    # (0.8 relative error in the split -> reshape -> transpose -> attention of GPT-2; docs/migration.md).
    size = next(a for a in (split_size, split_sizes, split_size_or_sections) if a.value is not None)
    return call("ops.split", self, size, axis=dim)


@function("a tuple of slices", aten.tensor_split, torch.tensor_split, method("tensor_split"))
def tensor_split(self, indices_or_sections=None, dim=0, sections=None, indices=None, tensor_indices_or_sections=None):
    """torch.tensor_split as slices along `dim`: at the given indices (`x[:, a:b]`; Python slicing clips and
    empties out of range as torch does), or into n sections, the first size % n of them one longer, their
    bounds computed from the run-time size."""
    split = next((a for a in (indices_or_sections, sections, indices, tensor_indices_or_sections)
                  if a.value is not None), None)
    if split is None or split.is_tensor:
        raise Unsupported("tensor_split by a tensor of indices or sections (values known only at run time)")
    d = dim.const("tensor_split's dim")
    d = d % self.ndim if self.ndim else d
    prefix = ":, " * d
    if split.items is not None:
        bounds = [str(a) for a in split.items]
    elif isinstance(split.value, (list, tuple)):
        bounds = [str(int(v)) for v in split.value]
    else:
        n = split.const("tensor_split's number of sections")
        size = f"{self}.shape[{d}]"
        bounds = [f"{i} * ({size} // {n}) + min({i}, {size} % {n})" for i in range(1, n)]
    starts, stops = [""] + bounds, bounds + [""]
    return "(" + ", ".join(f"{self}[{prefix}{a}:{b}]" for a, b in zip(starts, stops)) + ",)"


@function("mint.chunk", aten.chunk, torch.chunk, method("chunk"))
def chunk(self, chunks, dim=0):
    return call("mint.chunk", self, chunks, dim=dim)


@function("ops.unbind", aten.unbind, torch.unbind, method("unbind"))
def unbind(self, dim=0):
    # Not mint.unbind: its backward fails on CPU ("The pointer[input_tensor] is null").
    return call("ops.unbind", self, dim)


def _tensor_list(tensors: Arg) -> str:
    return "[" + ", ".join(str(t) for t in tensors.items) + "]" if tensors.items is not None else str(tensors)


@function("mint.cat", aten.cat, aten.concat, aten.concatenate, torch.cat, torch.concat, torch.concatenate)
def cat(tensors, dim=0):
    # torch skips 1-D empty operands beside tensors of higher rank (a legacy rule: transformers' DynamicCache cats its
    # empty (0,) start with the keys, Flaubert); mint.cat refuses mixed ranks. Such an operand is empty on every valid
    # input (non-empty, torch refuses the ranks), so leaving it out is exact
    if tensors.items is not None and any(t.is_tensor and len(t.shape) > 1 for t in tensors.items):
        kept = [t for t in tensors.items if not (t.is_tensor and t.shape == (0,))]
        if len(kept) < len(tensors.items):
            tensors = Arg("", NOT_CONSTANT, None, kept, tensors.kind)
    return call("mint.cat", _tensor_list(tensors), dim=dim)


@function("ops.stack", aten.stack, torch.stack)
def stack(tensors, dim=0):
    # mint.stack has no CPU kernel.
    return call("ops.stack", _tensor_list(tensors), dim)


@function("Tensor.shape[dim] (a symbolic size)", aten.sym_size)
def sym_size(self, dim):
    return f"{self}.shape[{dim}]"


# -- indexing ----------------------------------------------------------------------------------
@function("Tensor.__getitem__ / tuple indexing", operator.getitem)
def getitem(a, b):
    if not a.is_tensor:
        return f"{a}[{b}]"
    return f"{a}[{subscript(b)}]"


def _dims_prefix(dim: int, ndim: int) -> str:
    if dim < 0:
        dim += ndim
    return ":, " * dim


@function("Tensor.__getitem__ (slice)", aten.slice)
def slice_(self, dim=0, start=None, end=None, step=1, result=None):
    d = dim.const("dim")
    begin = "" if start.value in (None, 0) else str(start)
    stop = "" if end.value is None or end.value == _INT64_MAX else str(end)
    stride = "" if step.value == 1 else f":{step}"
    if not (begin or stop or stride):  # the whole dimension (`x[:]`): the same tensor, no copy op
        return Alias(self)
    if isinstance(result.example, torch.Tensor) and result.example.numel() == 0 and self.ndim:
        # empty on the example: MindSpore's CPU gradient of an empty slice fails, so the helper makes it zeros
        return call("slice_dim", self, d % self.ndim, begin or "None", stop or "None", step)
    return f"{self}[{_dims_prefix(d, self.ndim)}{begin}:{stop}{stride}]"


@function("Tensor.__getitem__ (select)", aten.select, torch.select, method("select"))
def select(self, dim, index):
    return f"{self}[{_dims_prefix(dim.const('dim'), self.ndim)}{index}]"


def _part(self: Arg, dim: int, text: str) -> str:
    """`self[:, :, text]` with `text` at dimension `dim`."""
    return f"{self}[{_dims_prefix(dim, self.ndim)}{text}]"


def _cast_to(src: Arg, self: Arg) -> str:
    return str(src) if src.dtype == self.dtype or self.dtype is None else call("ops.cast", src, ms_dtype(self.dtype))


@function("mint.cat (the slices around the written one); strided_scatter with a step", aten.slice_scatter)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    # the in-place pass writes `x[..., a:b].copy_(v)` into a tensor the program created as this op
    d = dim.const("dim") % max(self.ndim, 1)
    if step.value != 1:  # `x[..., 1:n:3] = y`: a gather of y's slices and a mask (generated_support)
        stop = "None" if end.value is None or end.value == _INT64_MAX else end
        return call("strided_scatter", self, _cast_to(src, self), d, "None" if start.value is None else start, stop,
                    step)
    parts = []
    if start.value not in (None, 0):
        parts.append(_part(self, d, f":{start}"))
    parts.append(_cast_to(src, self))
    if end.value is not None and end.value != _INT64_MAX:
        parts.append(_part(self, d, f"{end}:"))
    if len(parts) == 1:
        return parts[0]
    return call("mint.cat", f"[{', '.join(parts)}]", dim=d)


@function("mint.cat (the parts around the written index)", aten.select_scatter)
def select_scatter(self, src, dim, index):
    d = dim.const("dim") % self.ndim
    i = index.const("index")  # a negative index stays negative: it counts from the end at every size
    parts = [_part(self, d, f":{i}")] if i != 0 else []
    parts.append(call("mint.unsqueeze", _cast_to(src, self), d))
    if i != -1:
        parts.append(_part(self, d, f"{i + 1}:"))
    return call("mint.cat", f"[{', '.join(parts)}]", dim=d)


@function("mint.broadcast_to + ops.cast", aten.copy)
def copy(self, src, non_blocking=False):
    # the out-of-place form of `x.copy_(src)`: src, broadcast to x's shape, in x's dtype
    value = _cast_to(src, self)
    return value if src.shape == self.shape else call("mint.broadcast_to", value, f"{self}.shape")


@function("(identity: a fresh copy of a constant)", aten.lift_fresh_copy)
def lift_fresh_copy(self):
    return Alias(self)  # generated code never mutates, so a copy is the tensor itself


@function("ops.pad", aten.pad, torch.nn.functional.pad)
def pad(self=None, pad=None, mode="constant", value=None, input=None):
    # mint's ConstantPadND has no CPU kernel; the pad list is torch's order (last dimension first) in both
    tensor = self if self is not None and (self.is_tensor or self.value is not None) else input
    if mode.value != "constant":
        raise Unsupported(f"pad(mode={mode.value!r}) is not mapped (only 'constant')")
    fill = value if value.value is not None or value.is_tensor else literal(0.0)
    return call("ops.pad", tensor, pad, value=fill)


@function("mint.where (a boolean mask of the leading dimensions)", aten.index_put)
def index_put(self, indices, values, accumulate=False):
    # the out-of-place form of `x[mask] = v` (aten.index_put_): one boolean mask of x's shape or of its leading
    # dimensions (T5Gemma 2: `embeddings[ids == eoi] = eoi_embedding`, a (B, S) mask of a (B, S, H) tensor), v a
    # number or a tensor that broadcasts to the trailing dimensions alone: every selected position gets the same v,
    # so `where(mask, v, x)` is exact whatever the mask selects (v with one row per selected position is not)
    parts = indices.items if indices.items is not None else []
    if accumulate.value or len(parts) != 1 or parts[0].dtype != torch.bool or \
            tuple(parts[0].shape) != tuple(self.shape[:parts[0].ndim]):
        raise Unsupported("index_put is mapped for one boolean mask of the tensor's shape or of its leading "
                          "dimensions (x[mask] = v) only")
    trailing = tuple(self.shape[parts[0].ndim:])
    if values.is_tensor and (values.ndim > len(trailing) or any(
            v not in (1, t) for v, t in zip(reversed(tuple(values.shape)), reversed(trailing)))):
        raise Unsupported(f"index_put with values of shape {tuple(values.shape)} (one row per selected position) "
                          f"is not mapped: only values that broadcast to the unselected dimensions {trailing}")
    value = values if values.is_tensor else call("ops.full", "()", values, dtype=ms_dtype(self.dtype))
    mask = parts[0] if not trailing else call("mint.reshape", parts[0], f"{parts[0]}.shape + {(1,) * len(trailing)!r}")
    return call("mint.where", mask, call("ops.cast", value, ms_dtype(self.dtype)), self)


@function("Tensor.__getitem__ (advanced indexing)", aten.index)
def index(self, indices):
    parts = [":" if i.value is None else str(i) for i in indices.items]
    return f"{self}[{', '.join(parts)}{',' if len(parts) == 1 else ''}]"


@function("ops.tensor_scatter_elements", aten.scatter, torch.scatter, method("scatter"))
def scatter(self, dim, index, src=None, value=None, reduce=None):
    # Not mint.scatter (nor ops.scatter): MindSpore 2.10's CPU Scatter kernel, once run on one shape,
    # writes wrong elements for later calls of other shapes in the same process (a second converted
    # model's router computed a wrong group mask); TensorScatterElements has no such stale state.
    if reduce.value is not None:
        raise Unsupported(f"scatter(reduce={reduce.value!r}) is not mapped")
    source = src if src.value is not None or src.is_tensor else value
    if not source.is_tensor:  # a number: a tensor of it, the index's shape (the op takes a tensor)
        source = call("ops.full", f"{index}.shape", source, dtype=ms_dtype(self.dtype))
    return call("ops.tensor_scatter_elements", self, index, source, axis=dim)


_SCATTER_REDUCTIONS = ("sum", "mean", "amax", "amin")


@function("scatter_reduce (segment sums, maxima or minima)", aten.scatter_reduce, torch.scatter_reduce,
          method("scatter_reduce"))
def scatter_reduce(self, dim, index, src, reduce, include_self=True):
    # TAPAS's segment minimum: `zeros(n).scatter_reduce(0, index, values, "amin", include_self=False)`
    how = reduce.const("reduce")
    if how not in _SCATTER_REDUCTIONS:
        raise Unsupported(f"scatter_reduce(reduce={how!r}) is not mapped (supported: "
                          f"{', '.join(map(repr, _SCATTER_REDUCTIONS))})")
    if how == "mean" and not self.dtype.is_floating_point:
        raise Unsupported(f"scatter_reduce(reduce='mean') on {self.dtype} (torch rounds the integer mean down) is "
                          "not mapped (only floating dtypes)")
    if not self.is_tensor or self.ndim == 0:
        raise Unsupported("scatter_reduce into a 0-dimensional tensor is not mapped")
    return call("scatter_reduce", self, dim.const("dim") % self.ndim, index, _cast_to(src, self), repr(how),
                bool(include_self.const("include_self")))


@function("ops.unsorted_segment_sum", aten.index_add, torch.index_add, method("index_add"))
def index_add(self, dim, index, source, alpha=1):
    # self + the rows of `source` summed into the positions `index` names along `dim` (the rows summed first, then
    # added to self: torch adds them to self one by one, so a position receiving two or more rows into a nonzero
    # self may differ by rounding). Not mint.index_add: MindSpore 2.10's CPU kernel also writes its result into
    # `self` (measured: the input tensor changed).
    if not self.is_tensor or self.ndim == 0:
        raise Unsupported("index_add into a 0-dimensional tensor is not mapped")
    d = dim.const("dim") % self.ndim
    rows = source if d == 0 else call("mint.transpose", source, 0, d)
    summed = call("ops.unsorted_segment_sum", rows, index, f"{self}.shape[{d}]")
    summed = summed if d == 0 else call("mint.transpose", summed, 0, d)
    if alpha.const("alpha") != 1:
        summed = call("mint.mul", summed, alpha)
    return call("mint.add", self, summed)


@function("mint.gather", aten.gather, torch.gather, method("gather"))
def gather(self, dim, index, sparse_grad=False):
    return call("mint.gather", self, dim, index)


@function("ops.index_select", aten.index_select, torch.index_select, method("index_select"))
def index_select(self, dim, index):
    # mint.index_select has no CPU kernel.
    return call("ops.index_select", self, dim, index)


@function("ops.masked_fill", aten.masked_fill, torch.masked_fill, method("masked_fill"))
def masked_fill(self, mask, value):
    # MindSpore's CPU MaskedFill needs the value in the input's dtype (`masked_fill(~mask, 0)` on floats: Nemotron-H)
    if self.is_tensor and self.dtype.is_floating_point and value.is_constant and isinstance(value.value, (bool, int)):
        value = literal(float(value.value))
    elif self.is_tensor and value.is_tensor and value.dtype != self.dtype:
        value = call("ops.cast", value, ms_dtype(self.dtype))
    return call("ops.masked_fill", self, mask, value)


@function("mint.where", aten.where, torch.where)
def where(condition, self=None, other=None):
    if self.value is None and not self.is_tensor:
        raise Unsupported("torch.where(condition) (indices of nonzero entries) has a data-dependent shape")
    return call("mint.where", condition, self, other)


@function("mint.where", method("where"))
def where_method(self, condition, other):
    return call("mint.where", condition, self, other)


@function("mint.tile", aten.repeat)
def repeat(self, repeats):
    return call("mint.tile", self, sizes([repeats]))


@function("mint.tile", method("repeat"))
def repeat_method(self, *repeats):
    return call("mint.tile", self, sizes(repeats))


# -- sizes and attributes ------------------------------------------------------------------------
@function("Tensor.shape", method("size"))
def size(self, dim=None):
    return f"{self}.shape" if dim.value is None else f"{self}.shape[{dim}]"


@function("Tensor.ndim", method("dim"))
def dim(self):
    return f"{self}.ndim"


@function("Tensor.size (element count)", method("numel"))
def numel(self):
    return f"{self}.size"


_ATTRIBUTES = {"shape": "{}.shape", "dtype": "{}.dtype", "ndim": "{}.ndim"}
_RESULT_FIELDS = {"values": 0, "indices": 1}  # torch.max(x, dim) & co. return (values, indices)


@function("Tensor attributes", builtins.getattr)
def getattr_(obj, name, default=None):
    attribute = name.const("attribute name")
    if isinstance(obj.example, tuple) and attribute in _RESULT_FIELDS:
        return f"{obj}[{_RESULT_FIELDS[attribute]}]"
    if attribute == "T":
        return call("mint.permute", obj, tuple(reversed(range(obj.ndim))))
    if attribute == "device":
        return literal(None).code  # MindSpore places tensors by context, not per tensor
    if attribute not in _ATTRIBUTES:
        raise Unsupported(f"tensor attribute {attribute!r} is not mapped")
    return _ATTRIBUTES[attribute].format(obj)


# -- checks that only guard the trace ------------------------------------------------------------
@function("(dropped: export's metadata assertion)", aten._assert_tensor_metadata)
def tensor_metadata_assertion(a, size=None, stride=None, dtype=None, device=None, layout=None):
    # torch.export checks an input's dtype/shape here; the Cell checks input shapes up front.
    return NO_VALUE
