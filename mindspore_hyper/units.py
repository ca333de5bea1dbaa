"""Byte sizes and element types, one helper each: the text of a byte count, the size of one
element of a dtype, and the numpy type of a MindSpore dtype."""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["format_bytes", "format_seconds", "itemsize", "numpy_dtype"]

_BINARY = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_SHORT = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(n: float, short: bool = False) -> str:
    """The text of a byte count in binary units.

    Args:
        n: the byte count.
        short: one decimal and no space, e.g. '8.0KiB' (tables, error messages); else two
            decimals and IEC units, e.g. '4.00 GiB' (reports).

    Returns:
        The text; counts under 1 KiB in bytes ('512B' short, '512 B' otherwise).
    """
    if short:
        for unit, size in _SHORT:
            if abs(n) >= size:
                return f"{n / size:.1f}{unit}"
        return f"{int(n)}B"
    for unit, size in _BINARY:
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def format_seconds(seconds: float) -> str:
    """`seconds` to 3 significant digits in s, ms or us: a small model's predicted step is
    microseconds, which a fixed "0.000 s" hid."""
    if seconds == 0 or abs(seconds) >= 1:
        return f"{seconds:.3f} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def itemsize(dtype) -> int:
    """Bytes of one element of `dtype`: an int (taken as the size), a numpy dtype or its name,
    or a MindSpore dtype.

    Raises:
        ValueError: `dtype` has no element size.
    """
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return dtype
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        pass
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int) and size > 0:
        return size
    raise ValueError(f"cannot tell the element size of dtype {dtype!r}")


@functools.lru_cache(maxsize=None)
def numpy_dtype(dtype) -> np.dtype:
    """The numpy type MindSpore gives a tensor of MindSpore dtype `dtype` (``asnumpy``); bfloat16
    included. Replaces ``mindspore.dtype_to_nptype`` (deprecated since MindSpore 2.7)."""
    from mindspore import Tensor

    return Tensor(np.zeros((1,), np.float32)).astype(dtype).asnumpy().dtype
