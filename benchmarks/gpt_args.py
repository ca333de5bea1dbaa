"""What the GPT benchmarks (bench_sim_overhead*, bench_distributed) share so that both
frameworks measure the same model: its command-line options, one set of initial weights for
MindSpore and torch, and the float32 tolerance their losses must agree to."""
import argparse
import os

import numpy as np


def add_gpt_model_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--layers --hidden --heads --seq --vocab: examples/models.py's GPT, defaulting to the issue's model."""
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    return parser


def gpt_argument_parser(description: str) -> argparse.ArgumentParser:
    """The GPT's options (`add_gpt_model_arguments`) and --batch --repeat."""
    parser = add_gpt_model_arguments(argparse.ArgumentParser(description=description))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="timed steps after one warm-up step")
    return parser


def token_batch(vocab: int, batch: int, seq: int, seed: int = 0):
    """(ids, labels): int32 arrays [batch, seq] drawn in that order from numpy's generator
    `seed`; both frameworks train on these (torch converts them to int64)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, vocab, (batch, seq)).astype(np.int32),
            rng.integers(0, vocab, (batch, seq)).astype(np.int32))


# ---------------------------------------------------------------- the same weights on both sides
# One set of initial weights, drawn with numpy and loaded into examples/models.py's GPT
# (MindSpore) and bench_sim_overhead_torch.GPT (torch), so both frameworks train the same model
# from the same point. Keys are the MindSpore parameter names; `torch_name` maps them.
_TORCH_SUFFIXES = {".embedding_table": ".weight", ".gamma": ".weight", ".beta": ".bias"}


def initial_weights(vocab: int, hidden: int, heads: int, layers: int, seq: int, seed: int = 0) -> dict:
    """The GPT's initial parameters as float32 numpy arrays keyed by MindSpore name: matrices
    and embeddings N(0, 0.02) (GPT-2's initialisation), biases N(0, 0.02) too (non-zero, so the
    bias paths are compared), LayerNorm scale 1 and shift 0; shapes as nn.Dense / nn.Linear
    store them ([out, in])."""
    del heads  # the parameter shapes do not depend on it
    rng = np.random.default_rng(seed)
    shapes = {"embed.embedding_table": (vocab, hidden), "pos.embedding_table": (seq, hidden)}
    for i in range(layers):
        b = f"blocks.{i}."
        shapes.update({b + "ln1.gamma": (hidden,), b + "ln1.beta": (hidden,),
                       b + "attn.qkv.weight": (3 * hidden, hidden), b + "attn.qkv.bias": (3 * hidden,),
                       b + "attn.proj.weight": (hidden, hidden), b + "attn.proj.bias": (hidden,),
                       b + "ln2.gamma": (hidden,), b + "ln2.beta": (hidden,),
                       b + "fc1.weight": (4 * hidden, hidden), b + "fc1.bias": (4 * hidden,),
                       b + "fc2.weight": (hidden, 4 * hidden), b + "fc2.bias": (hidden,)})
    shapes.update({"ln_f.gamma": (hidden,), "ln_f.beta": (hidden,), "head.weight": (vocab, hidden)})
    weights = {}
    for name, shape in shapes.items():
        if name.endswith(".gamma"):
            weights[name] = np.ones(shape, np.float32)
        elif name.endswith(".beta"):
            weights[name] = np.zeros(shape, np.float32)
        else:
            weights[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return weights


def torch_name(mindspore_name: str) -> str:
    """The torch peer's parameter name for a MindSpore one (embedding_table/gamma/beta renamed)."""
    for old, new in _TORCH_SUFFIXES.items():
        if mindspore_name.endswith(old):
            return mindspore_name[: -len(old)] + new
    return mindspore_name


def load_mindspore_weights(model, weights: dict) -> None:
    """Copy `weights` (initial_weights) into a MindSpore GPT, every parameter exactly once.

    Raises:
        ValueError: a parameter is missing from `weights`, has another shape, or a weight is left over.
    """
    from mindspore import Tensor

    left = dict(weights)
    for param in model.get_parameters():
        if param.name not in left:
            raise ValueError(f"weights: no entry for MindSpore parameter {param.name!r}")
        value = left.pop(param.name)
        if tuple(param.shape) != value.shape:
            raise ValueError(f"weights[{param.name!r}]: shape {value.shape}, expected {tuple(param.shape)}")
        param.set_data(Tensor(value))
    if left:
        raise ValueError(f"weights: entries the model does not have: {sorted(left)}")


# ---------------------------------------------------------------- loss equality
FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24


def reduction_depth(vocab: int, hidden: int, heads: int, layers: int, seq: int, batch: int) -> int:
    """Sum of the lengths of the reductions on the path from the inputs to the GPT's loss: per
    block LayerNorm (hidden), qkv (hidden), scores (head_dim), softmax (seq), context (seq),
    proj (hidden), LayerNorm (hidden), fc1 (hidden), fc2 (4 hidden); then the final LayerNorm
    (hidden), the LM head (hidden), the log-sum-exp (vocab) and the mean over batch x seq tokens."""
    block = 6 * hidden + hidden // heads + 2 * seq + 4 * hidden
    return layers * block + 2 * hidden + vocab + batch * seq


def loss_tolerance(vocab: int, hidden: int, heads: int, layers: int, seq: int, batch: int, step: int) -> float:
    """Relative tolerance for two float32 computations of the GPT's loss after `step` optimizer
    updates from the same weights and data (another summation order or kernel: another
    framework, a sharded run). A float32 reduction of length n is exact to n * u relative
    (u = 2^-24, first order, the standard bound); chained reductions add their bounds, and
    cross-entropy at initialisation is well conditioned (loss ~ log vocab), so the step-0
    losses agree to reduction_depth * u. Each update starts from weights that differ by what
    the previous steps' rounding did; its effect on the loss is at most of the same order
    (Adam's update is bounded by the learning rate per element, and the elements whose update
    rounding can flip carry gradients near zero, so they move the loss by next to nothing),
    so the bound grows linearly: (step + 1) * reduction_depth * u."""
    return (step + 1) * reduction_depth(vocab, hidden, heads, layers, seq, batch) * FLOAT32_UNIT_ROUNDOFF


def compare_losses(what: str, losses, reference, cfg: dict, batch: int) -> dict:
    """Per-step relative differences of `losses` against `reference` and whether each is within
    `loss_tolerance` (a JSON-able dict: what, max_relative, tolerances, ok)."""
    rel = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, reference)]
    tol = [loss_tolerance(batch=batch, step=k, **cfg) for k in range(len(rel))]
    return {"what": what, "relative": rel, "tolerance": tol, "ok": all(r <= t for r, t in zip(rel, tol)),
            "max_relative": max(rel) if rel else 0.0}


# ---------------------------------------------------------------- run bookkeeping
def load_average() -> float:
    """The 1-minute load average (os.getloadavg()[0])."""
    return os.getloadavg()[0]
