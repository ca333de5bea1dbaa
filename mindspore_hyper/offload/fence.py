"""Kernel fences: wait for MindSpore's PyNative kernels without busy-waiting.

``_pynative_executor.sync()`` waits for every launched kernel by spinning on the calling thread
(``AsyncRQueue::Wait``); on a small CPU machine the spinning thread takes a core from the very
kernels it waits for. A `KernelFence` launches a tiny aot kernel (``MsHyperFence`` in
``ccsrc/kernels/store_kernels.cc``) that marks the fence as passed when MindSpore executes it.
PyNative executes launched kernels in launch order (``tests/test_offload_ops.py`` checks it), so
once the fence has passed every kernel launched before it has run. ``wait()`` sleeps on a
condition variable with the GIL released.
"""
from __future__ import annotations

import os

import numpy as np

from mindspore import Tensor, ops
from mindspore.common import dtype as mstype
from mindspore.graph.api import _pynative_executor

from mindspore_hyper import _core

__all__ = ["KernelFence"]


class AotOpPool:
    """CPU aot Custom ops running `kernel` of mindspore_hyper._core with an int64[1] output, taken
    in turn (see `KernelFence` for why); built on first use."""

    def __init__(self, kernel: str, size: int):
        self.kernel, self.size = kernel, size
        self._ops: list = []
        self._next = 0

    def next(self):
        """The next op of the pool."""
        if not self._ops:
            lib = os.path.abspath(_core.__file__)
            for k in range(self.size):
                op = ops.Custom(f"{lib}:{self.kernel}", out_shape=[1], out_dtype=mstype.int64, func_type="aot")
                op.add_prim_attr("primitive_target", "CPU")
                op.add_prim_attr("mshyper_pool_slot", k)
                self._ops.append(op)
        op = self._ops[self._next % self.size]
        self._next += 1
        return op


class KernelFence:
    """Launches a fence kernel; ``passed()`` polls, ``wait()`` blocks until it has executed.

    Should the kernel not run within `timeout_s` (e.g. an earlier kernel failed and the queue was
    dropped), ``wait`` falls back to ``_pynative_executor.sync()``, which also reports the error.

    Measured (MindSpore 2.10, CPU): launching a Custom op waits until the previous launch of the
    same primitive has executed, so the fences take turns over a pool of primitives that differ
    in an attribute; a launch then waits only for the fence launched 8 fences earlier.
    """

    _ops = AotOpPool("MsHyperFence", size=8)

    def __init__(self):
        op = KernelFence._ops.next()
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
