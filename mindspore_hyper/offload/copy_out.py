"""Copy a Tensor's value out of MindSpore's PyNative kernel stream without synchronizing it.

``Tensor.asnumpy()`` waits for every kernel launched so far (measured on MindSpore 2.10 CPU: from
a background thread too), so reading a gradient in the middle of the backward stalls it.
`TensorCopyOut` launches a tiny aot kernel (``MsHyperCopyOut`` in ``ccsrc/kernels/store_kernels.cc``)
behind the kernels producing the tensor; when MindSpore executes it, the bytes land in a mailbox
that any thread can wait for (``take``, GIL released).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from mindspore import Tensor

from mindspore_hyper import _core
from mindspore_hyper.offload.fence import AotOpPool
from mindspore_hyper.units import numpy_dtype

__all__ = ["TensorCopyOut"]


class TensorCopyOut:
    """Launches the copy of `tensor`; ``take()`` returns its value as a numpy array.

    Args:
        tensor: the Tensor (any shape; a numeric dtype).
    """

    _ops = AotOpPool("MsHyperCopyOut", size=16)

    def __init__(self, tensor: Tensor):
        op = TensorCopyOut._ops.next()
        self.shape = tuple(tensor.shape)
        self.dtype = numpy_dtype(tensor.dtype)
        self.id = _core.mailbox_new_id()
        self._value: Optional[np.ndarray] = None
        self._abandoned = False
        try:
            op(tensor, Tensor(np.array([self.id], dtype=np.int64)))
        except BaseException:
            _core.mailbox_forget(self.id)
            raise

    def abandon(self) -> None:
        """No one will take the value: the mailbox is dropped now or when the copy arrives."""
        if self._value is None and not self._abandoned:
            _core.mailbox_forget(self.id)
            self._abandoned = True

    def take(self, timeout_s: float = 120.0) -> np.ndarray:
        """The tensor's value, once the copy kernel has run (blocks up to `timeout_s` seconds).

        Raises:
            TimeoutError: the kernel did not run in time (e.g. an earlier kernel failed).
            RuntimeError: the copy was abandoned.
        """
        if self._abandoned:
            raise RuntimeError("take() of an abandoned TensorCopyOut")
        if self._value is None:
            raw = _core.mailbox_take(self.id, timeout_s)
            if raw is None:
                _core.mailbox_forget(self.id)
                raise TimeoutError(f"the copy of a tensor of shape {self.shape} was not delivered within "
                                   f"{timeout_s:.0f} s (did an earlier kernel fail?)")
            self._value = raw.view(self.dtype).reshape(self.shape)
        return self._value
