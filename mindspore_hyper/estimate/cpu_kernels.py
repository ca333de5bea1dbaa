"""Per-op kernel times of a transformer layer measured with MindSpore's CPU kernels at the job's shapes.

`measure_kernels(config, strategy)` times, in this process (PyNative, the threads already set),
each op of `layer_forward_ops` and `head_forward_ops` on one device as the examples' GPT
(examples/models.py) runs it, at the op's local shape (micro-batch, tensor and context parallel
applied): forward alone, and forward + backward (`mindspore.value_and_grad` over the op's inputs
and weights), each the median of a few calls after a warm-up, synchronised. Kernels per op:

=================  ==========================================================================
op                 MindSpore kernels timed
=================  ==========================================================================
norm 1/2, final    nn.LayerNorm on [b, s, h]
qkv, projection,   nn.Dense (MatMul with transposed weight + BiasAdd) on [T, in]; the LM head
mlp up/down, head  has no bias
attention core     reshape of the qkv output to its heads, split into q, k, v, their transposes,
                   BatchMatMul Q K^T, BatchMatMul P V, transpose + reshape of the context
scores             scale, causal-mask add, softmax on [b, a/t, s, s]
mlp activation     nn.GELU on [T, f/t]
dropout-add 1/2    the residual add on [b, s, h] (the GPT has no dropout)
cross-entropy      nn.CrossEntropyLoss on [T, V/t] logits
=================  ==========================================================================

Other ops (MoE routers, gated MLPs) are not measured; the step-time model times them by the
roofline. The optimizer (`nn.AdamWeightDecay`, as the benchmarks train) is timed over one
layer's local parameters: seconds per parameter element.

Results are keyed by `layer_ops.kernel_key(op)`, the op's name with its FLOPs and bytes, so a table
measured for one job's shapes is only used for ops of exactly those shapes.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

from mindspore_hyper.estimate.layer_ops import OPTIMIZER_KEY, head_forward_ops, kernel_key, layer_forward_ops
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["measure_kernels"]


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of fn() after a warm-up call; each call waits for its kernels by reading a
    4-element op queued after them (PyNative runs ops in order), not by copying fn's outputs."""
    from mindspore import Tensor, ops

    tiny = Tensor(np.ones(4, np.float32))

    def synchronize() -> None:
        ops.add(tiny, tiny).asnumpy()

    fn()
    synchronize()
    times: List[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _builders(config: TransformerConfig, strategy: JobStrategy):
    """op name -> (inputs, cell or function) at the op's local shapes."""
    from mindspore import Tensor, nn, ops

    c, st = config, strategy
    t, cp = st.tensor, st.context_parallel
    b, s, h = c.micro_batch, c.seq_len // cp, c.hidden
    s_norm = s // t if st.sequence_parallel else s
    heads, dh = c.heads // t, c.head_dim
    q_local, kv = h // t, math.ceil(c.kv_heads / t) * dh
    f_local, v_local = c.ffn // t, c.vocab // t
    tokens = b * s
    rng = np.random.default_rng(0)

    def tensor(*shape):
        return Tensor(rng.standard_normal(shape).astype(np.float32) * 0.1)

    def dense(n_in, n_out, bias=True):
        return [tensor(tokens, n_in)], nn.Dense(n_in, n_out, has_bias=bias)

    norm = ([tensor(b, s_norm, h)], nn.LayerNorm((h,)))
    mask = Tensor(np.triu(np.full((s, c.seq_len), -1e9, np.float32), 1))
    scale = math.sqrt(dh)

    def core(qkv, p):  # qkv features [heads, (q, k, v), head_dim], as examples/models.py lays them out
        q, k, v = (part.transpose(0, 2, 1, 3) for part in ops.split(qkv.reshape(b, s, heads, 3 * dh), dh, -1))
        scores = ops.matmul(q, k.swapaxes(-1, -2))
        context = ops.matmul(p, v).transpose(0, 2, 1, 3).reshape(b, s, q_local)
        return scores, context

    def scores(x):
        return ops.softmax(x / scale + mask, -1)

    labels = Tensor(rng.integers(0, v_local, tokens).astype(np.int32))
    entropy = nn.CrossEntropyLoss()
    return {
        "norm 1": norm, "norm 2": norm, "final norm": ([tensor(b, s_norm, h)], nn.LayerNorm((h,))),
        "qkv": dense(h, q_local + 2 * kv), "projection": dense(q_local, h),
        "mlp up": dense(h, f_local), "mlp down": dense(f_local, h), "lm head": dense(h, v_local, bias=False),
        "attention core": ([tensor(b, s, q_local + 2 * kv), tensor(b, heads, s, c.seq_len)], core),
        "scores": ([tensor(b, heads, s, c.seq_len)], scores),
        "mlp activation": ([tensor(tokens, f_local)], nn.GELU()),
        "dropout-add 1": ([tensor(b, s_norm, h), tensor(b, s_norm, h)], ops.add),
        "dropout-add 2": ([tensor(b, s_norm, h), tensor(b, s_norm, h)], ops.add),
        "cross-entropy": ([tensor(tokens, v_local)], lambda x: entropy(x, labels)),
    }


def _time_op(inputs, fn, repeats: int, sync: Callable[[], object]) -> Tuple[float, float]:
    """(forward seconds, backward seconds) of fn(*inputs); backward = value_and_grad - forward;
    `sync()` before each (the calibration's processes time the same op at once)."""
    import mindspore as ms
    from mindspore import nn

    weights = fn.trainable_params() if isinstance(fn, nn.Cell) else None
    positions = tuple(range(len(inputs)))
    grad = ms.value_and_grad(fn, positions, weights) if weights else ms.value_and_grad(fn, positions)
    sync()
    forward = _median_seconds(lambda: fn(*inputs), repeats)
    sync()
    both = _median_seconds(lambda: grad(*inputs), repeats)
    return forward, max(both - forward, 0.0)


def _optimizer_seconds_per_parameter(config: TransformerConfig, strategy: JobStrategy, repeats: int) -> float:
    from mindspore import Parameter, Tensor, nn

    h, t = config.hidden, strategy.tensor
    q = h // t + 2 * math.ceil(config.kv_heads / t) * config.head_dim
    f = config.ffn // t
    shapes = [(h,), (h,), (q, h), (q,), (h, h // t), (h,), (h,), (h,), (f, h), (f,), (h, f), (h,)]
    params = [Parameter(Tensor(np.zeros(shape, np.float32)), name=f"p{i}") for i, shape in enumerate(shapes)]
    grads = tuple(Tensor(np.full(shape, 1e-3, np.float32)) for shape in shapes)
    optimizer = nn.AdamWeightDecay(params, learning_rate=1e-4)
    seconds = _median_seconds(lambda: optimizer(grads), repeats)
    return seconds / sum(int(np.prod(s)) for s in shapes)


def measure_kernels(config: TransformerConfig, strategy: JobStrategy, repeats: int = 3,
                    sync: Callable[[], object] = lambda: None) -> Dict[str, Tuple[float, float]]:
    """Measure the job's ops on this process's MindSpore CPU kernels (module doc).

    Args:
        config: the model and micro-batch (dense, non-gated: the examples' GPT).
        strategy: tensor, sequence and context parallel sizes (the local shapes).
        repeats: timed calls per measurement (median) after one warm-up call.
        sync: called before each measurement (a barrier of the processes measured at once, so
            that every op is timed while all of them time it; the same op count on each).

    Returns:
        kernel_key(op) -> (forward seconds, backward seconds) for each measured op, and
        OPTIMIZER_KEY -> (seconds per parameter element of one AdamWeightDecay step, 0).

    Raises:
        ValueError: repeats < 1, or a model the GPT kernels do not describe (named).
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: expected an int >= 1")
    if config.experts or config.gated_mlp or config.kv_heads != config.heads:
        raise ValueError("config: measure_kernels times the examples' dense GPT (experts=0, gated_mlp=False, "
                         "kv_heads=heads)")
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    builders = _builders(config, strategy)
    table: Dict[str, Tuple[float, float]] = {}
    ops = layer_forward_ops(config, strategy, "materialized") + head_forward_ops(config, strategy)
    measured: Dict[str, Tuple[float, float]] = {}
    for op in ops:
        if op.name not in builders:
            continue
        if op.name not in measured:  # norm 1 / norm 2 etc. share shapes but are timed each
            inputs, fn = builders[op.name]
            measured[op.name] = _time_op(inputs, fn, repeats, sync)
        table[kernel_key(op)] = measured[op.name]
    sync()
    table[OPTIMIZER_KEY] = (_optimizer_seconds_per_parameter(config, strategy, repeats), 0.0)
    return table
