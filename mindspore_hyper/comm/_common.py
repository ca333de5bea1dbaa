"""Shared helpers of the comm package: dtype / op names and the C++ module."""
from __future__ import annotations

import numpy as np

from mindspore_hyper import _core

_C = _core.comm
CommError = _C.CommError
CommTimeout = _C.CommTimeout
CommMismatch = _C.CommMismatch

DTYPES = ("float32", "float16", "int32", "float64", "int64", "uint8")
OPS = ("sum", "max", "min", "avg")


_NAMES = {np.dtype(n): n for n in DTYPES}


def dtype_name(array: np.ndarray) -> str:
    name = _NAMES.get(array.dtype)
    if name is not None:
        return name
    name = np.dtype(array.dtype).name
    if name not in DTYPES:
        raise TypeError(f"dtype {name} is not supported by the comm library; supported: {', '.join(DTYPES)}")
    return name


def is_bfloat16(x) -> bool:
    """A bfloat16 array (MindSpore's `asnumpy` gives ml_dtypes' bfloat16), which the C++ library has no kernels for."""
    return np.asarray(x).dtype.name == "bfloat16"


def check_op(op: str) -> str:
    if op not in OPS:
        raise ValueError(f"op={op!r}: expected one of {', '.join(OPS)}")
    return op


def normalize_dim(dim: int, ndim: int, what: str) -> int:
    """`dim` in [0, ndim); ValueError naming `what` when it is out of range."""
    if not -ndim <= dim < ndim:
        raise ValueError(f"{what}: dim {dim} is out of range for an array of {ndim} dimensions")
    return dim % ndim


def contiguous(array) -> np.ndarray:
    """A C-contiguous numpy array of the same shape, 0-d included (a copy only when needed)."""
    return np.require(np.asarray(array), requirements="C")


def split_counts(n: int, parts: int) -> list:
    """n items into `parts` near-equal counts (the first n % parts get one more)."""
    base, rem = divmod(n, parts)
    return [base + (1 if i < rem else 0) for i in range(parts)]
