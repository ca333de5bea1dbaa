"""Training a converted Cell beside its torch original: the same AdamW steps on a next-token loss."""
from typing import Callable, List, Tuple

import numpy as np
import torch
import mindspore as ms
from mindspore import mint, nn, ops

from mindspore_hyper.migrate.compare import to_mindspore


def next_token_loss_torch(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of position t's logits against token t+1."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def next_token_loss_ms(logits, ids):
    flat = mint.reshape(logits[:, :-1], (-1, logits.shape[-1]))
    log_probs = ops.log_softmax(flat, -1)  # mint's log_softmax has no CPU kernel
    picked = mint.gather(log_probs, 1, mint.reshape(ids[:, 1:], (-1, 1)))
    return mint.neg(mint.mean(picked))


class NextTokenLoss(nn.Cell):
    """A causal LM Cell (ids -> logits) wrapped as ids -> its next-token loss."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def construct(self, ids):
        return next_token_loss_ms(self.lm(ids), ids)


class AdamW:
    """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments) on MindSpore Parameters,
    in NumPy float32 (MindSpore's AdamW kernels have no CPU implementation)."""

    def __init__(self, params, lr: float, weight_decay: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.wd, self.betas, self.eps = list(params), lr, weight_decay, betas, eps
        self.m = [np.zeros(p.shape, np.float32) for p in self.params]
        self.v = [np.zeros(p.shape, np.float32) for p in self.params]
        self.t = 0

    def __call__(self, grads) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            g = g.asnumpy()
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            value = p.asnumpy() * np.float32(1 - self.lr * self.wd)
            denom = np.sqrt(v) / np.float32(np.sqrt(1 - b2 ** self.t)) + np.float32(self.eps)
            value -= np.float32(self.lr / (1 - b1 ** self.t)) * m / denom
            p.set_data(ms.Tensor(value.astype(np.float32)))


def train_both(model: torch.nn.Module, cell, batches: List[Tuple[torch.Tensor, ...]], torch_loss: Callable,
               ms_loss: Callable, lr: float = 1e-2, weight_decay: float = 0.01,
               eps: float = 1e-3) -> Tuple[List[float], List[float]]:
    """One AdamW step per batch on both (torch.optim.AdamW / the NumPy AdamW above, same hyper-parameters);
    returns each step's loss. `torch_loss(output, batch)` / `ms_loss(output, batch)` give the loss of the
    torch model's / the Cell's output on a batch (a tuple of torch tensors; the Cell gets them converted).

    eps is 1e-3 (torch's default is 1e-8): a parameter whose exact gradient is zero (an attention key
    bias: softmax ignores a per-row shift) gets rounding noise of ~1e-9 as its gradient, which Adam with
    a tiny eps turns into full lr-sized steps of random sign on either side; with eps=1e-3 such noise
    moves nothing while real gradients (>= 1e-3) still take Adam steps."""
    torch_opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, eps=eps)
    ms_opt = AdamW(cell.trainable_params(), lr=lr, weight_decay=weight_decay, eps=eps)
    torch_losses, ms_losses = [], []
    for batch in batches:
        torch_opt.zero_grad()
        loss = torch_loss(model(*batch), batch)
        loss.backward()
        torch_opt.step()
        torch_losses.append(float(loss.detach()))
        inputs = [to_mindspore(x) for x in batch]
        step = ms.value_and_grad(lambda *xs: ms_loss(cell(*xs), inputs), None, ms_opt.params)
        value, grads = step(*inputs)
        ms_opt(grads)
        ms_losses.append(float(value.asnumpy()))
    return torch_losses, ms_losses


def max_parameter_error(model: torch.nn.Module, cell, floor: float = 1e-3) -> float:
    """Worst relative difference (max |a - b| / max(max |b|, floor)) between every torch parameter and the
    Cell's. The floor: a parameter that starts at zero with an exact zero gradient (BERT's attention key
    bias) stays at rounding noise (~1e-9) on both sides; it is held to floor * the tolerance absolutely."""
    from mindspore_hyper.migrate.state_dict import cell_parameters

    params = cell_parameters(cell)
    worst = 0.0
    for name, p in model.named_parameters():
        prefix, _, leaf = name.rpartition(".")
        candidates = [name] + [f"{prefix}.{n}" if prefix else n for n in {"weight": ("gamma", "embedding_table"),
                                                                        "bias": ("beta",)}.get(leaf, ())]
        found = next((params[c] for c in candidates if c in params), None)
        assert found is not None, f"no Cell parameter for {name}"
        want = p.detach().numpy()
        worst = max(worst, float(np.abs(found.asnumpy() - want).max() / max(np.abs(want).max(), floor)))
    return worst
