"""Synthetic images for tests, the example and the benchmark: smooth random scenes and the
near-duplicates a request stream really contains (re-encoded and slightly shifted copies)."""
from __future__ import annotations

import numpy as np

__all__ = ["random_image", "reencode", "shift", "blend"]


def random_image(rng: np.random.Generator, height: int, width: int, channels: int = 3,
                 components: int = 6) -> np.ndarray:
    """A (C, H, W) float32 image in [0, 1]: a sum of random waves (amplitude ~ 1 / frequency, up to
    3.5 periods across) and blobs."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    y /= height
    x /= width
    image = np.zeros((channels, height, width))
    for _ in range(components):
        fy, fx = rng.uniform(-2.5, 2.5, size=2)
        phase = rng.uniform(0, 2 * np.pi)
        # amplitude ~ 1 / frequency, as in natural images
        wave = np.sin(2 * np.pi * (fy * y + fx * x) + phase) / max(1.0, np.hypot(fy, fx))
        cy, cx, r = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.08, 0.3)
        blob = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * r * r))
        image += rng.uniform(0.2, 1.0, size=(channels, 1, 1)) * (wave + 2 * blob)
    image -= image.min()
    image /= max(image.max(), 1e-12)
    return image.astype(np.float32)


def _dct_matrix(n: int = 8) -> np.ndarray:
    k = np.arange(n)[:, None]
    m = np.cos(np.pi * (2 * np.arange(n)[None, :] + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    m[0] /= np.sqrt(2.0)
    return m


def reencode(image: np.ndarray, rng: np.random.Generator, quality: float = 0.04, gain: float = 1.0,
             offset: float = 0.0, noise: float = 0.01) -> np.ndarray:
    """A JPEG-like re-encoding: a tone change (gain, offset), 8x8 block DCT coefficients rounded to
    steps of `quality` (x position weight), pixel noise, 8-bit quantisation. Same shape."""
    c, h, w = image.shape
    out = image.astype(np.float64) * gain + offset
    hp, wp = -h % 8, -w % 8
    padded = np.pad(out, ((0, 0), (0, hp), (0, wp)), mode="edge")
    d = _dct_matrix()
    blocks = padded.reshape(c, (h + hp) // 8, 8, (w + wp) // 8, 8).transpose(0, 1, 3, 2, 4)
    coeffs = d @ blocks @ d.T
    steps = quality * (1.0 + np.add.outer(np.arange(8), np.arange(8)))
    blocks = d.T @ (np.round(coeffs / steps) * steps) @ d
    out = blocks.transpose(0, 1, 3, 2, 4).reshape(c, h + hp, w + wp)[:, :h, :w]
    out = out + rng.normal(0.0, noise, size=out.shape)
    return (np.round(np.clip(out, 0.0, 1.0) * 255.0) / 255.0).astype(np.float32)


def shift(image: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """The image moved by (dy, dx) pixels, the uncovered border filled with the edge pixels."""
    c, h, w = image.shape
    pad = max(abs(dy), abs(dx))
    padded = np.pad(image, ((0, 0), (pad, pad), (pad, pad)), mode="edge")
    return np.ascontiguousarray(padded[:, pad - dy:pad - dy + h, pad - dx:pad - dx + w])


def blend(a: np.ndarray, b: np.ndarray, alpha: float) -> np.ndarray:
    """(1 - alpha) a + alpha b: a different image at a chosen closeness to `a`."""
    return ((1.0 - alpha) * a + alpha * b).astype(np.float32)
