"""Kernel fences: wait for MindSpore's PyNative kernels without busy-waiting.

``_pynative_executor.sync()`` waits for every launched kernel by spinning on the calling thread
(``AsyncRQueue::Wait``); on a small CPU machine the spinning thread takes a core from the very
kernels it waits for. A `KernelFence` launches a tiny aot kernel (``MsHyperFence`` in
``ccsrc/aot/store_kernels.cc``) that marks the fence as passed when MindSpore executes it.
PyNative executes launched kernels in launch order (``tests/test_offload_ops.py`` checks it), so
once the fence has passed every kernel launched before it has run. ``wait()`` sleeps on a
condition variable with the GIL released.
"""
from __future__ import annotations

import os

import numpy as np

from mindspore import Tensor, ops
from mindspore.common import dtype as mstype
from mindspore.common.api import _pynative_executor

from mindspore_hyper import _core

__all__ = ["KernelFence"]


_POOL_SIZE = 8


def aot_op_pool(kernel: str, size: int = _POOL_SIZE) -> list:
    """`size` CPU aot Custom ops running `kernel` of mindspore_hyper._core with an int64[1] output,
    differing in an attribute (see `KernelFence` for why launches take turns over a pool)."""
    lib = os.path.abspath(_core.__file__)
    pool = []
    for k in range(size):
        op = ops.Custom(f"{lib}:{kernel}", out_shape=[1], out_dtype=mstype.int64, func_type="aot")
        op.add_prim_attr("primitive_target", "CPU")
        op.add_prim_attr("mshyper_pool_slot", k)
        pool.append(op)
    return pool


class KernelFence:
    """Launches a fence kernel; ``passed()`` polls, ``wait()`` blocks until it has executed.

    Should the kernel not run within `timeout_s` (e.g. an earlier kernel failed and the queue was
    dropped), ``wait`` falls back to ``_pynative_executor.sync()``, which also reports the error.

    Measured (MindSpore 2.10, CPU): launching a Custom op waits until the previous launch of the
    same primitive has executed, so the fences take turns over a pool of primitives that differ
    in an attribute; a launch then waits only for the fence launched `_POOL_SIZE` fences earlier.
    """

    _pool: list = []
    _next = 0

    def __init__(self):
        if not KernelFence._pool:
            KernelFence._pool = aot_op_pool("MsHyperFence")
        op = KernelFence._pool[KernelFence._next % _POOL_SIZE]
        KernelFence._next += 1
        self.id = _core.fence_new_id()
        self._passed = False
        try:
            op(Tensor(np.array([self.id], dtype=np.int64)))
        except BaseException:
            _core.fence_forget(self.id)
            raise

    def passed(self) -> bool:
        if not self._passed:
            self._passed = _core.fence_poll(self.id)
        return self._passed

    def abandon(self) -> None:
        """No one will wait for this fence: its id is forgotten now or when it passes (each
        fence that passed is remembered until someone polls or waits for it)."""
        if not self._passed:
            _core.fence_forget(self.id)
            self._passed = True

    def wait(self, timeout_s: float = 30.0) -> None:
        if self._passed:
            return
        if not _core.fence_wait(self.id, timeout_s):
            _core.fence_forget(self.id)
            _pynative_executor.sync()
        self._passed = True
