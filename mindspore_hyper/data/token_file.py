"""A flat file of token ids packed into fixed-length training samples.

The file is a raw array of token ids (`numpy.memmap`, no header: what `array.tofile(path)`
writes, or the `.bin` of nanoGPT / Megatron-style preprocessing). Sample `i` is the
`seq_len + 1` tokens starting at `i * seq_len`: its first `seq_len` are the inputs and its last
`seq_len` the labels (the next token of each input). Consecutive samples share one token (the
last label of sample `i` is the first input of sample `i + 1`), so every token of the file is
predicted once; the tail that does not fill a whole sample is left out. Documents separated by an
end-of-text token in the stream are packed across sample boundaries, as in GPT pre-training.
"""
from __future__ import annotations

import os
import zlib
from typing import Dict, Tuple, Union

import numpy as np

__all__ = ["TokenFile"]

_DIGEST_TOKENS = 4096  # tokens at each end of the file that the fingerprint's checksum covers


class TokenFile:
    """Random access to the packed samples of a token file (see module docstring).

    Args:
        path: the file of token ids.
        seq_len: tokens per sample's inputs (each sample reads `seq_len + 1` tokens).
        dtype: the ids' numpy dtype in the file (uint16 for vocabularies up to 65536, else
            uint32 or int32).
        out_dtype: the numpy dtype of the samples returned (MindSpore's embeddings take int32).

    Raises:
        ValueError: a missing or empty file, a size that is not a whole number of `dtype` items,
            `seq_len` not a positive int or larger than the file allows (at least `seq_len + 1`
            tokens are needed), naming the field.
    """

    def __init__(self, path: Union[str, os.PathLike], seq_len: int, dtype: Union[str, np.dtype] = np.uint16,
                 out_dtype: Union[str, np.dtype] = np.int32):
        self.path = os.fspath(path)
        self.dtype = np.dtype(dtype)
        self.out_dtype = np.dtype(out_dtype)
        if self.dtype.kind not in "iu":
            raise ValueError(f"dtype={self.dtype}: token ids are integers (uint16, uint32, int32, ...)")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len={seq_len!r}: expected an int >= 1")
        if not os.path.isfile(self.path):
            raise ValueError(f"path={self.path!r}: no such file")
        size = os.path.getsize(self.path)
        if size == 0 or size % self.dtype.itemsize:
            raise ValueError(f"path={self.path!r}: {size} bytes is not a positive whole number of {self.dtype} "
                             f"token ids ({self.dtype.itemsize} bytes each); is dtype= right?")
        self.tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        if seq_len + 1 > len(self.tokens):
            raise ValueError(f"seq_len={seq_len}: a sample needs seq_len + 1 = {seq_len + 1} tokens but "
                             f"{self.path!r} holds only {len(self.tokens)}; use seq_len <= {len(self.tokens) - 1}")
        self.seq_len = seq_len

    def __len__(self) -> int:
        """The number of whole samples: (tokens - 1) // seq_len."""
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        """Sample `index`: (inputs, labels), each `seq_len` ids of `out_dtype`."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sample {index} of a token file of {n} samples")
        start = (index % n) * self.seq_len
        window = np.asarray(self.tokens[start:start + self.seq_len + 1], dtype=self.out_dtype)
        return window[:-1], window[1:]

    def batch(self, indices: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The samples at `indices` stacked: (inputs, labels), each of shape (len(indices), seq_len)."""
        starts = np.asarray(indices, np.int64) * self.seq_len
        windows = np.stack([self.tokens[s:s + self.seq_len + 1] for s in starts]) if len(starts) else \
            np.empty((0, self.seq_len + 1), self.dtype)
        windows = windows.astype(self.out_dtype, copy=False)
        return windows[:, :-1], windows[:, 1:]

    def fingerprint(self) -> Dict[str, object]:
        """What identifies the samples (a loader's saved position refers to them): the file's name,
        token count and dtype, seq_len, the sample count, and a CRC32 of the tokens at both ends."""
        head = np.ascontiguousarray(self.tokens[:_DIGEST_TOKENS]).tobytes()
        tail = np.ascontiguousarray(self.tokens[-_DIGEST_TOKENS:]).tobytes()
        return {"kind": "token_file", "name": os.path.basename(self.path), "tokens": int(len(self.tokens)),
                "dtype": str(self.dtype), "seq_len": self.seq_len, "samples": len(self),
                "crc32": zlib.crc32(tail, zlib.crc32(head))}

    def __repr__(self) -> str:
        return f"TokenFile({self.path!r}, seq_len={self.seq_len}, {len(self.tokens)} tokens, {len(self)} samples)"
