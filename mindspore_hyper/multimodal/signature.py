"""A cheap image signature computed before the encoder: the zero-mean, unit-norm grey thumbnail.

The image is turned to grey (luma weights for 3 channels, the channel mean otherwise) and
area-averaged onto a `size` x `size` grid; the grid minus its mean, divided by its norm, is the
signature. The cosine of two signatures is then the Pearson correlation of the two thumbnails:

- brightness offsets and contrast gains (re-encoding, gamma-like tone changes) do not move it;
- area averaging removes pixel noise and compression artefacts (a JPEG block is smaller than a cell);
- a shift by s pixels moves every cell by s / (side / size) of a cell, so for content smoother
  than a cell the correlation stays close to 1;
- images of different content correlate weakly, so a threshold near 1 separates them.

It costs one pass over the pixels (O(H W)), far below a ViT forward. Any resolution >= `size`
maps to the same dimension, so images of different sizes can share one cache.
"""
from __future__ import annotations

import numpy as np

__all__ = ["image_signature", "signature_dim"]

_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float64)


def signature_dim(size: int = 16) -> int:
    """Length of `image_signature(..., size)`."""
    return int(size) * int(size)


def _grey(image: np.ndarray) -> np.ndarray:
    if image.ndim == 2:
        return image
    if image.ndim == 3:
        channels = image.shape[0]
        if channels == 3:
            return np.tensordot(_LUMA, image, axes=(0, 0))
        return image.mean(axis=0)
    raise ValueError(f"image: expected shape (H, W) or (C, H, W), got {image.shape}")


def _area_average(grey: np.ndarray, size: int) -> np.ndarray:
    h, w = grey.shape
    rows = (np.arange(size) * h) // size
    cols = (np.arange(size) * w) // size
    sums = np.add.reduceat(np.add.reduceat(grey, rows, axis=0), cols, axis=1)
    counts = np.outer(np.diff(np.append(rows, h)), np.diff(np.append(cols, w)))
    return sums / counts


def image_signature(image, size: int = 16) -> np.ndarray:
    """The signature of one image (see module docstring).

    Args:
        image: array-like or mindspore Tensor of shape (H, W) or (C, H, W), H and W >= `size`.
        size: thumbnail side; the signature has size * size values.

    Returns:
        float32 vector of length size * size with zero mean and unit norm, or all zeros for a
        constant image (which has no pattern to compare: such a signature never matches).

    Raises:
        ValueError: bad size, shape, non-finite pixels, or an image smaller than the thumbnail.
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 2:
        raise ValueError(f"size: expected an int >= 2, got {size!r}")
    if hasattr(image, "asnumpy"):
        image = image.asnumpy()
    pixels = np.asarray(image, dtype=np.float64)
    grey = _grey(pixels)
    if grey.shape[0] < size or grey.shape[1] < size:
        raise ValueError(f"image: {grey.shape[0]}x{grey.shape[1]} pixels is smaller than the {size}x{size} "
                         f"thumbnail; pass a smaller size")
    if not np.all(np.isfinite(grey)):
        raise ValueError("image: contains NaN or infinite pixels")
    thumb = _area_average(grey, int(size)).ravel()
    thumb -= thumb.mean()
    norm = np.linalg.norm(thumb)
    if norm <= 1e-12 * max(1.0, float(np.abs(grey).max())):
        return np.zeros(thumb.size, np.float32)
    return (thumb / norm).astype(np.float32)
