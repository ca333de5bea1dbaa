"""Element types as MindSpore names them (the manifest's `dtype`), as safetensors codes them, and in numpy."""
from __future__ import annotations

import functools
from typing import Dict

import numpy as np

from mindspore_hyper.checkpoint.errors import CheckpointError

__all__ = ["SAFETENSORS_CODES", "ITEMSIZE", "numpy_dtype", "safetensors_code", "itemsize"]

# MindSpore dtype name -> safetensors dtype code
SAFETENSORS_CODES: Dict[str, str] = {
    "Float64": "F64", "Float32": "F32", "Float16": "F16", "BFloat16": "BF16",
    "Int64": "I64", "Int32": "I32", "Int16": "I16", "Int8": "I8",
    "UInt64": "U64", "UInt32": "U32", "UInt16": "U16", "UInt8": "U8", "Bool": "BOOL",
}

# safetensors dtype code -> bytes per element
ITEMSIZE: Dict[str, int] = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                            "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


def itemsize(dtype: str) -> int:
    """Bytes per element of a MindSpore dtype name (no MindSpore import: usable in any thread)."""
    return ITEMSIZE[safetensors_code(dtype)]


def safetensors_code(dtype: str) -> str:
    """The safetensors code of a MindSpore dtype name, e.g. "Float32" -> "F32".

    Raises:
        CheckpointError: a dtype safetensors cannot store.
    """
    try:
        return SAFETENSORS_CODES[dtype]
    except KeyError:
        raise CheckpointError(f"dtype {dtype}: not storable in safetensors; supported: "
                              f"{', '.join(SAFETENSORS_CODES)}") from None


@functools.lru_cache(maxsize=None)
def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a MindSpore dtype name (BFloat16: the bfloat16 type MindSpore's
    `asnumpy` returns)."""
    safetensors_code(dtype)
    if dtype == "BFloat16":
        import mindspore as ms

        return ms.Tensor([0.0], ms.bfloat16).asnumpy().dtype
    return np.dtype("bool" if dtype == "Bool" else dtype.lower())
