"""Element types as MindSpore names them (the manifest's `dtype`), as safetensors codes them, and in numpy."""
from __future__ import annotations

import functools
from typing import Dict

import numpy as np

from mindspore_hyper.checkpoint.errors import CheckpointError

__all__ = ["SAFETENSORS_CODES", "numpy_dtype", "safetensors_code"]

# MindSpore dtype name -> safetensors dtype code
SAFETENSORS_CODES: Dict[str, str] = {
    "Float64": "F64", "Float32": "F32", "Float16": "F16", "BFloat16": "BF16",
    "Int64": "I64", "Int32": "I32", "Int16": "I16", "Int8": "I8",
    "UInt64": "U64", "UInt32": "U32", "UInt16": "U16", "UInt8": "U8", "Bool": "BOOL",
}


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
