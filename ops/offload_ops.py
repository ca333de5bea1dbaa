"""MindSpore custom ops (aot, CPU) that fetch / store a tensor from the HyperOffload store.

The kernels (``ccsrc/kernels/store_kernels.cc``) live in ``mindspore_hyper._core`` itself, so they use
the same store instances as the Python API: a reference names its store by handle (each
`OffloadStore` registers one), so several stores in one process each serve their own kernels.
Usable in PYNATIVE and GRAPH mode.

* ``StoreFetch(ref)()`` / ``store_fetch(ref)``: a tensor with the stored tensor's value. Not
  differentiable (its only input names the tensor).
* ``StorePut(ref)(x)`` / ``store_put(x, ref)``: writes ``x`` into the stored tensor (a new
  version) and returns ``x``; the gradient passes straight through to ``x``.

PyNative runs kernels asynchronously: a `StorePut` inside a network has written the store once
its output has been synchronized (e.g. ``.asnumpy()``); the two convenience functions wait.
"""
from __future__ import annotations

import os

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.graph.api import _pynative_executor

__all__ = ["StoreFetch", "StorePut", "store_fetch", "store_put", "core_library"]


def core_library() -> str:
    """Path of the shared library holding the aot kernels (mindspore_hyper._core)."""
    from mindspore_hyper import _core

    return os.path.abspath(_core.__file__)


def _ms_dtype(np_dtype) -> ms.dtype:
    """The MindSpore dtype of a numpy dtype (as a tensor of it gets)."""
    return Tensor(np.zeros((1,), np.dtype(np_dtype))).dtype


def _ref_tensor(ref) -> Tensor:
    """The kernels' name of a stored tensor: [store handle, tensor id]."""
    return Tensor(np.array([ref.store_handle, ref.tid], dtype=np.int64))


class StoreFetch(nn.Cell):
    """Fetches stored tensor `ref` (an `OffloadStore.put` result) inside a network."""

    def __init__(self, ref):
        super().__init__()
        shape, dtype = tuple(ref.shape), _ms_dtype(ref.dtype)
        self.ref_ids = _ref_tensor(ref)

        def bprop(ref_ids, out, dout):
            return (ops.zeros_like(ref_ids),)

        self.op = ops.Custom(f"{core_library()}:MsHyperStoreFetch", out_shape=lambda ref_ids: shape,
                             out_dtype=lambda ref_ids: dtype, func_type="aot", bprop=bprop)
        self.op.add_prim_attr("primitive_target", "CPU")
        # The output shape is not a function of the input's shape: make the op's attributes differ
        # per output signature so MindSpore's infer/kernel caches never mix two fetches.
        self.op.add_prim_attr("mshyper_out_signature", f"{shape}:{np.dtype(ref.dtype).name}")

    def construct(self):
        return self.op(self.ref_ids)


class StorePut(nn.Cell):
    """Writes its input into stored tensor `ref` and returns the input (identity gradient)."""

    def __init__(self, ref):
        super().__init__()
        self.shape = tuple(ref.shape)
        self.ref_ids = _ref_tensor(ref)

        def bprop(x, ref_ids, out, dout):
            return (dout, ops.zeros_like(ref_ids))

        self.op = ops.Custom(f"{core_library()}:MsHyperStorePut", out_shape=lambda x, ref_ids: x,
                             out_dtype=lambda x, ref_ids: x, func_type="aot", bprop=bprop)
        self.op.add_prim_attr("primitive_target", "CPU")

    def construct(self, x):
        return self.op(x, self.ref_ids)


def store_fetch(ref) -> Tensor:
    """PyNative convenience: the stored tensor's value as a Tensor (through the aot kernel).

    Waits for the kernel, so later Python writes to the store cannot leak into the result.
    """
    out = StoreFetch(ref)()
    _pynative_executor.sync()
    return out


def store_put(x: Tensor, ref) -> Tensor:
    """PyNative convenience: writes `x` into stored tensor `ref`; returns `x`.

    Waits for the kernel, so the store holds the new value when this returns.
    """
    out = StorePut(ref)(x)
    _pynative_executor.sync()
    return out
