"""Small models for the pipeline tests, built from MindSpore's own layers (same seed -> same weights)."""
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn


def dense_chain(width: int = 16, depth: int = 4, seed: int = 1) -> nn.WithLossCell:
    """nn.SequentialCell of Dense / ReLU / Tanh under nn.WithLossCell(MSELoss)."""
    ms.set_seed(seed)
    np.random.seed(seed)
    layers = [nn.Dense(8, width), nn.ReLU()]
    for i in range(depth - 2):
        layers += [nn.Dense(width, width), nn.Tanh() if i % 2 else nn.ReLU()]
    layers.append(nn.Dense(width, 4))
    return nn.WithLossCell(nn.SequentialCell(layers), nn.MSELoss())


def batch(n: int = 8, seed: int = 2, out: int = 4):
    """Inputs (n, 8) and targets (n, out), standard normal float32 from `seed`."""
    rng = np.random.default_rng(seed)
    return (Tensor(rng.standard_normal((n, 8)).astype(np.float32)),
            Tensor(rng.standard_normal((n, out)).astype(np.float32)))


def pipelined_over_2(model, **pipeline):
    """`model` under auto_parallelize on 2 simulated pipeline ranks, 1F1B over 2 microbatches (plus `pipeline`)."""
    import mindspore_hyper as mh

    mh.set_context(mode="simulation", device_num=2)
    return mh.auto_parallelize(model, mh.Layout((2,), ("pipeline",))(tensor_map=()),
                               pipeline=dict(schedule="1f1b", microbatches=2, **pipeline))


def single_device_run(model, x, y, steps: int = 5, lr: float = 1e-2):
    """Losses and final parameters of plain MindSpore training (nn.Adam, TrainOneStepCell)."""
    step = nn.TrainOneStepCell(model, nn.Adam(model.trainable_params(), lr))
    losses = [float(step(x, y).asnumpy()) for _ in range(steps)]
    return losses, {p.name: p.asnumpy().copy() for p in model.trainable_params()}


def pipelined_and_reference(make, inputs, parallelize, steps: int = 5, lr: float = 1e-2):
    """Two models from `make` under seed 0: one trained on one device (single_device_run), the other
    parallelized by `parallelize` (must give a PipelineModel) and trained with nn.Adam on the same
    `inputs`. Returns (the parallelized model's network, the PipelineModel, its losses, the reference)."""
    from mindspore_hyper.pipeline import PipelineModel

    ms.set_seed(0)
    reference = single_device_run(make(), *inputs, steps=steps, lr=lr)
    ms.set_seed(0)
    model = make()
    parallel = parallelize(model)
    assert isinstance(parallel, PipelineModel)
    optimizer = nn.Adam(parallel.optimizer_parameters(), lr)
    losses = [float(parallel.train_step(optimizer, *inputs).asnumpy()) for _ in range(steps)]
    return model, parallel, losses, reference


def single_device_clipped_run(model, x, y, max_norm: float, steps: int = 5, lr: float = 1e-2):
    """Losses, final parameters and each step's global gradient norm (float64 sum of squares) of
    plain MindSpore training with `ops.clip_by_global_norm(grads, max_norm)` before each nn.Adam step."""
    from mindspore import ops

    params = model.trainable_params()
    step, optimizer = ms.value_and_grad(model, None, params), nn.Adam(params, lr)
    losses, norms = [], []
    for _ in range(steps):
        loss, grads = step(x, y)
        losses.append(float(loss.asnumpy()))
        norms.append(float(np.sqrt(sum(np.sum(g.asnumpy().astype(np.float64) ** 2) for g in grads))))
        optimizer(ops.clip_by_global_norm(grads, max_norm))
    return losses, {p.name: p.asnumpy().copy() for p in params}, norms


def assert_same_training(model, losses, reference, lr=1e-2, loose=(), tokens=64):
    """Losses and parameters of `len(losses)` nn.Adam steps at `lr` equal to the single-device run's
    up to float32 rounding in any evaluation order (tests/tolerances.py): each parameter normwise
    within the training bound for the model's longest reduction (a parameter's fan-in or fan-out, or
    `tokens`, at least the batch's samples x positions in these tests), every element within Adam's
    displacement bound (a near-zero gradient's rounding noise becomes steps of up to ~lr). `loose`:
    names of parameters whose exact gradient is 0 (attention key biases), all noise, checked by the
    elementwise bound only. The losses: normwise within the same training bound (a loss is a sum of
    squares or of log-probabilities computed from those parameters)."""
    from tolerances import assert_adam_training_close, reduction_length, training_rtol  # tests/ (not on an msrun worker's path)

    ref_losses, ref_params = reference
    steps = len(losses)
    reduction = reduction_length(model.trainable_params(), tokens)
    rtol = training_rtol(reduction, steps)
    assert len(ref_losses) == steps
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol, atol=0)
    for p in model.trainable_params():
        assert_adam_training_close(p.asnumpy(), ref_params[p.name], lr, steps, reduction, err_msg=p.name,
                                   noise_only=p.name in loose)


def gpt(seed: int = 0, layers: int = 4):
    """examples/models.py GPT, tiny: its construct passes a mask to every block of a CellList."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
    from models import GPT

    ms.set_seed(seed)
    return GPT(vocab=32, hidden=16, heads=2, layers=layers, seq=8)


def tokens(vocab: int = 32, shape=(4, 8), seed: int = 0):
    """Token ids and labels."""
    rng = np.random.default_rng(seed)
    return (Tensor(rng.integers(0, vocab, shape).astype(np.int32)),
            Tensor(rng.integers(0, vocab, shape).astype(np.int32)))
