"""float32 master weights read in bfloat16 (issue 41 items 1 and 3), shared by the simulation test
(test_bfloat16_gradient_reduction.py) and the msrun case (dist_worker.py's "cast_weights", checked
in tests/runtime/distributed/test_train_options_msrun.py).

`CastWeights` reads one float32 Parameter through a cast it makes itself (`w.astype(bfloat16)`)
and one through a Cell of mixed-precision type BF16 (`to_float`: MindSpore's kernel launch casts
it). Each device's gradient contribution to a weight is its rows' x^T c from the emulated MatMul's
float32 backward, rounded to bfloat16; the data-parallel sum (with gradient accumulation, over the
devices and the micro-batches) is taken on the float32 Parameter's gradient, once per step: each
contribution cast to float32, then added in float32 (Megatron's `grad_reduce_in_fp32`), in
simulation and under msrun alike. The values are chosen so that every float32 step is exact
(`data`): the expected gradient is exact, and differs from a sum rounded to bfloat16.
"""
import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

import mindspore_hyper as mh
from mindspore_hyper import Layout

ROWS = 2  # rows per device and micro-batch: a sum of two products of bfloat16 values is float32-exact
LR = 0.5  # SGD: the update of an exact gradient with a power-of-two step is exact


def bf16(a: np.ndarray) -> np.ndarray:
    """numpy float32 rounded to bfloat16, to nearest, ties to even (MindSpore's Cast), as float32."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def data(devices: int, micro_batches: int):
    """(w, v, x, c): bfloat16-exact values in [0.5, 1), the batch `devices * micro_batches * ROWS`
    rows. A product of two has <= 16 significant bits, a sum of two products <= 17, and a sum of
    up to 8 contributions rounded to bfloat16 (8 bits each, exponents within 3 of each other) stays
    within float32's 24 bits: only the roundings to bfloat16 round."""
    rng = np.random.default_rng(4)
    pick = lambda shape: bf16(rng.uniform(0.5, 1.0, shape).astype(np.float32))  # noqa: E731
    rows = devices * micro_batches * ROWS
    return pick((8, 4)), pick((8, 4)), pick((rows, 8)), pick((rows, 4))


class _Inner(nn.Cell):
    def __init__(self, v: np.ndarray):
        super().__init__()
        self.v = Parameter(Tensor(v), name="v")

    def construct(self, x):
        return ops.matmul(x, self.v)


class CastWeights(nn.Cell):
    """loss = sum(c * (float32(bf16(x) @ bf16(w)) + float32(inner(x)))), `inner` a BF16 Cell."""

    def __init__(self, w: np.ndarray, v: np.ndarray):
        super().__init__()
        self.w = Parameter(Tensor(w), name="w")
        self.inner = _Inner(v).to_float(ms.bfloat16)

    def construct(self, x, c):
        h = ops.matmul(x.astype(ms.bfloat16), self.w.astype(ms.bfloat16)).astype(ms.float32)
        return ((h + self.inner(x).astype(ms.float32)) * c).sum()


def expected_gradient(x: np.ndarray, c: np.ndarray, devices: int, micro_batches: int) -> np.ndarray:
    """The gradient of either weight: the (device, micro-batch) contributions, each rounded to
    bfloat16, summed in float32 (exact here) and divided by the micro-batch count."""
    parts = [bf16(x[i:i + ROWS].T @ c[i:i + ROWS]) for i in range(0, devices * micro_batches * ROWS, ROWS)]
    return np.sum(parts, axis=0, dtype=np.float32) / np.float32(micro_batches)


def train_one_step(devices: int, micro_batches: int):
    """One `train_step` of CastWeights on `devices` data-parallel devices (the current mode):
    (model, gradients by name, the weights' starting values, x, c)."""
    mh.set_context(cpu_bfloat16="emulate")
    w, v, x, c = data(devices, micro_batches)
    model = mh.auto_parallelize(CastWeights(w, v), Layout((devices,), ("data",))(tensor_map=()))
    optimizer = nn.SGD(model.optimizer_parameters(), learning_rate=LR)
    model.train_step(optimizer, Tensor(x), Tensor(c), accumulation_steps=micro_batches)
    grads = {name: np.array(model.last_gradients[name]) for name in ("w", "inner.v")}
    return model, optimizer, grads, {"w": w, "inner.v": v}, x, c


def run_case(case: str):
    """The msrun case (4 processes, data 4, 2 micro-batches): this rank's gradients and weights
    against the exact expectation, and its step's backward collectives."""
    del case
    previous = mh.get_context("cpu_bfloat16")
    try:
        model, optimizer, grads, start, x, c = train_one_step(4, 2)
    finally:
        mh.set_context(cpu_bfloat16=previous)  # the job's later cases run as they would alone
    want = expected_gradient(x, c, 4, 2)
    weights = {"w": model.network.w.asnumpy(), "inner.v": model.network.inner.v.asnumpy()}
    result = {"grad_mismatches": {n: int((g != want).sum()) for n, g in grads.items()},
              "weight_mismatches": {n: int((weights[n] != start[n] - np.float32(LR) * want).sum()) for n in grads},
              "rounded_sum_mismatches": int((bf16(want) != want).sum()),
              "grad_dtypes": sorted({str(g.dtype) for g in grads.values()}),
              "comm_backward": model.report(optimizer).comm_backward}
    return None, lambda expected: result
