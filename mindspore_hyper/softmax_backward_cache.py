"""A guard against a MindSpore 2.10 bug: a Softmax backward first built over an axis of size 1.

MindSpore 2.10 (PyNative, CPU) builds Softmax's backward once per (rank, `dim` as written, dtype)
and reuses it for every later shape. When the first one built is over an axis of size 1 (an
attention over a single key: SegFormer's reduced sequence on small images), every later
Softmax(dim) backward of that rank and dtype is wrong, its forward right. Found by the migration
sweep: SegFormer's one-device gradients made SpeechT5's simulated ones 11x too large
(`tests/runtime/simulation/test_softmax_backward_cache.py` reproduces it).

`ensure_softmax_backward()` builds those backwards first, from inputs with no axis of size 1, so
that MindSpore keeps right ones (`_probes`: ranks up to `MAX_RANK`, as the simulation stacks
shards along extra leading axes; every dim in float32 up to `EVERY_DIM_RANK`, else the last axis);
where the process already built a wrong one, it clears MindSpore's PyNative caches,
builds them again and warns that softmax gradients computed before were wrong. The package calls
it where it starts work: `auto_parallelize` for float32 and the model's other floating dtypes
(`model_dtypes`: its parameters' and its Cells' mixed-precision types), a HyperParallel mesh's
first use and `migrate.convert` for float32. It builds each dtype once per process (about 10 ms a
probe), and again after `autodiff.reset_after_failure` clears the caches (`forget`).
"""
from __future__ import annotations

import warnings
from typing import Iterable, List, Sequence, Set, Tuple

import numpy as np

__all__ = ["ensure_softmax_backward", "forget", "model_dtypes", "MAX_RANK", "DTYPES"]

MAX_RANK = 8  # a simulated op runs on its shards stacked along one more leading axis per mesh axis (batched.py)
EVERY_DIM_RANK = 4
DTYPES = ("float32", "float16", "float64")  # bfloat16 has no CPU Softmax kernel in MindSpore 2.10
SIZE = 3  # the softmax axis's length in the probes (2 along the others): no axis of size 1
_FLAG_DTYPES = {"FP16": "float16", "FP32": "float32"}  # a Cell's mixed_precision_type (to_float)
_built: Set[str] = set()


def ensure_softmax_backward(dtypes: Iterable[str] = ("float32",)) -> None:
    """Make MindSpore's cached Softmax backwards of `dtypes` right (see the module docstring);
    each dtype once per process; nothing outside PyNative mode or inside a gradient recording
    (tried again at the next call). Names outside `DTYPES` (bfloat16: no CPU kernel) are ignored.

    Raises:
        RuntimeError: a Softmax backward stays wrong after MindSpore's caches were cleared.
    """
    todo = [d for d in DTYPES if d in set(dtypes) and d not in _built]
    if not todo:
        return
    import mindspore as ms
    from mindspore.graph.api import _pynative_executor

    if ms.get_context("mode") != ms.PYNATIVE_MODE or _pynative_executor.grad_flag():
        return
    wrong = _build_and_check(todo)
    if wrong:
        _pynative_executor.clear_res()  # every dtype's backwards go: build the ones built before too
        todo = [d for d in DTYPES if d in set(todo) | _built]
        _built.clear()
        still = _build_and_check(todo)
        if still:
            raise RuntimeError(f"MindSpore's Softmax backward is wrong for {_describe(still)} even after its PyNative "
                               "caches were cleared")
        warnings.warn(f"MindSpore's cached Softmax backward was wrong for {_describe(wrong)} (a MindSpore 2.10 bug: "
                      "the first Softmax backward built over an axis of size 1 is reused for every later shape); "
                      "mindspore_hyper rebuilt it. Softmax gradients computed earlier in this process were wrong: "
                      "compute references after importing and using mindspore_hyper, or in a fresh process",
                      RuntimeWarning, stacklevel=2)
    _built.update(todo)


def forget() -> None:
    """MindSpore's PyNative caches were cleared: build the backwards again at the next ensure call."""
    _built.clear()


def model_dtypes(network) -> Set[str]:
    """float32 and the floating dtypes `network` computes in: its parameters' and the
    mixed-precision types of its Cells (`Cell.to_float`)."""
    found = {"float32"}
    for param in network.get_parameters():
        found.add(str(param.dtype).lower())
    for _, cell in network.cells_and_names():
        flag = getattr(cell, "mixed_precision_type", None)
        if flag is not None and getattr(flag, "name", "") in _FLAG_DTYPES:
            found.add(_FLAG_DTYPES[flag.name])
    return {d for d in found if d in DTYPES}


def _probes(dtype: str) -> List[Tuple[int, int]]:
    """(rank, dim) probed: in float32 every dim up to rank `EVERY_DIM_RANK`, beyond it and in the
    other dtypes the last axis, written both ways."""
    every = EVERY_DIM_RANK if dtype == "float32" else 0
    return [(rank, dim) for rank in range(1, MAX_RANK + 1)
            for dim in (range(-rank, rank) if rank <= every else sorted({-1, rank - 1}))]


def _probe_input(rank: int, dim: int) -> np.ndarray:
    shape = [2] * rank
    shape[dim] = SIZE
    count = int(np.prod(shape))
    return (np.sin(np.arange(count) * 1.7) * 2.0).reshape(shape)


def _build_and_check(dtypes: Sequence[str]) -> List[Tuple[str, int, int]]:
    """One gradient call per dtype over every probe (which builds each backward MindSpore has not
    cached); returns the (dtype, rank, dim) whose gradient is not softmax's."""
    import mindspore as ms
    from mindspore import Tensor, mint

    wrong = []
    for name in dtypes:
        dtype = getattr(ms, name)
        probes = _probes(name)
        inputs = [_probe_input(rank, dim) for rank, dim in probes]
        weights = [np.cos(np.arange(x.size) * 0.9).reshape(x.shape) for x in inputs]
        tensors = [Tensor(x, dtype) for x in inputs]

        def total(*xs):
            parts = [(mint.softmax(x, dim=dim) * Tensor(w, dtype)).sum()
                     for x, (_, dim), w in zip(xs, probes, weights)]
            return sum(parts[1:], parts[0])

        grads = ms.grad(total, grad_position=tuple(range(len(probes))))(*tensors)
        eps = float(np.finfo(np.dtype(name)).eps)
        for (rank, dim), x, w, g in zip(probes, inputs, weights, grads):
            y = np.exp(x - x.max(dim, keepdims=True))
            y /= y.sum(dim, keepdims=True)
            want = y * (w - (w * y).sum(dim, keepdims=True))
            # a few roundings of the dtype on values of size <= 1 each; a wrong backward is off by ~0.1-0.5
            if not np.abs(g.astype(ms.float64).asnumpy() - want).max() <= 16 * eps * (1 + np.abs(w).max()):
                wrong.append((name, rank, dim))
    return wrong


def _describe(keys: List[Tuple[str, int, int]]) -> str:
    shown = ", ".join(f"{dtype} rank {rank} dim {dim}" for dtype, rank, dim in keys[:4])
    return shown + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
