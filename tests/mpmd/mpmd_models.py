"""Small multimodal models and a single-device reference trainer for the MPMD tests."""
import numpy as np
import mindspore as ms
from mindspore import nn, ops


class Multimodal(nn.Cell):
    """Text and vision encoders feeding a fusion layer; two captions per image; returns the loss."""

    def __init__(self, text_layers=1, hidden=16):
        super().__init__()
        cells = [nn.Dense(8, hidden), nn.ReLU()]
        for _ in range(text_layers):
            cells += [nn.Dense(hidden, hidden), nn.GELU()]
        self.text_encoder = nn.SequentialCell(cells)
        self.vision_encoder = nn.SequentialCell(nn.Dense(12, hidden), nn.Tanh(), nn.LayerNorm((hidden,)))
        self.fusion_layer = nn.Dense(2 * hidden, 4)
        self.hidden = hidden

    def construct(self, text, image, target):
        pooled = self.text_encoder(text).reshape(image.shape[0], -1, self.hidden).mean(1)
        out = self.fusion_layer(ops.concat((pooled, self.vision_encoder(image)), -1))
        return ((out - target) ** 2).mean()


def multimodal_batch(images=16, captions_per_image=2, seed=0):
    rng = np.random.default_rng(seed)
    text = rng.standard_normal((images * captions_per_image, 8)).astype(np.float32)
    image = rng.standard_normal((images, 12)).astype(np.float32)
    target = rng.standard_normal((images, 4)).astype(np.float32)
    return ms.Tensor(text), ms.Tensor(image), ms.Tensor(target)


def make_pair(factory, seed=1):
    """Two identically initialised models (one to parallelize, one reference)."""
    ms.set_seed(seed)
    a = factory()
    ms.set_seed(seed)
    b = factory()
    for p, q in zip(a.trainable_params(), b.trainable_params()):
        q.set_data(p.data.copy())
    return a, b


def train_reference(model, batches, lr=1e-2):
    """Losses, first-step gradients and final parameters of plain single-device Adam training."""
    opt = nn.Adam(model.trainable_params(), learning_rate=lr)
    grad_fn = ms.value_and_grad(model, None, model.trainable_params())
    losses, first = [], None
    for batch in batches:
        loss, grads = grad_fn(*batch)
        if first is None:
            first = {p.name: g.asnumpy() for p, g in zip(model.trainable_params(), grads)}
        opt(grads)
        losses.append(float(loss))
    return losses, first, {p.name: p.asnumpy() for p in model.trainable_params()}


def train_parallel(model, batches, lr=1e-2):
    opt = nn.Adam(model.optimizer_parameters(), learning_rate=lr)
    losses, first = [], None
    for batch in batches:
        losses.append(float(model.train_step(opt, *batch)))
        if first is None:
            first = dict(model.last_gradients)
    return losses, first, {p.name: p.asnumpy() for p in model.network.trainable_params()}


def train_by_backward(model, batches, lr=1e-2):
    """As train_parallel, each step `loss = model(*batch); loss.backward();
    model.optimizer_step(opt)`."""
    from mindspore_hyper.hyper_parallel.autograd_compat import (disable_mindspore_backward_compat,
                                                                enable_mindspore_backward_compat)
    opt = nn.Adam(model.optimizer_parameters(), learning_rate=lr)
    losses, first = [], None
    for batch in batches:
        # on only for the step: MindSpore 2.10's value_and_grad of a Cell (train_step, the reference)
        # fails while its grad flag is on ("Can not find top cell for backward")
        enable_mindspore_backward_compat()
        try:
            loss = model(*batch)
            loss.backward()
            model.optimizer_step(opt)
        finally:
            disable_mindspore_backward_compat()
        losses.append(float(loss))
        if first is None:
            first = dict(model.last_gradients)
    return losses, first, {p.name: p.asnumpy() for p in model.network.trainable_params()}


def assert_same_training(parallel, reference, lr=1e-2, tokens=64):
    """Losses, first-step gradients and final parameters of `len(losses)` nn.Adam steps equal to the
    reference up to float32 rounding in any order (tests/tolerances.py), for the longest reduction of
    the model (a parameter's fan-in or fan-out, or `tokens`, at least the batch's rows here)."""
    from tolerances import (assert_adam_training_close, assert_within, gradient_tolerance, reduction_length,
                            training_rtol)  # tests/ (not on an msrun worker's path)

    (pl, pg, pp), (rl, rg, rp) = parallel, reference
    assert pg.keys() == rg.keys() and pp.keys() == rp.keys()
    steps = len(rl)
    reduction = reduction_length(list(rp.values()), tokens)
    np.testing.assert_allclose(pl, rl, rtol=training_rtol(reduction, steps), atol=0)
    names = list(rg)
    for name, tol in zip(names, gradient_tolerance([rg[n] for n in names], reduction)):
        assert_within(pg[name], rg[name], tol, name)
    for name in rp:
        assert_adam_training_close(pp[name], rp[name], lr, steps, reduction, err_msg=name)
