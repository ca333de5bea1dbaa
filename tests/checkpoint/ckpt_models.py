"""Shared by the checkpoint tests and their msrun worker: the example GPT, Megatron-style
strategies on any (data, tensor) mesh, fixed batches, and global arrays of what a model holds."""
import os
import sys

import numpy as np
from mindspore import Tensor, nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples"))
from models import GPT  # noqa: E402

from mindspore_hyper import Layout  # noqa: E402

LR = 1e-3


def gpt():
    return GPT(vocab=128, hidden=64, heads=4, layers=2, seq=16)


def megatron(data: int, tensor: int, zero: bool):
    """Column/row tensor parallelism over `tensor`, data parallelism over `data`, ZeRO-1 over
    `data` when `zero`."""
    s = Layout((data, tensor), ("data", "tensor"))(tensor_map=(), optimizer_state="data" if zero else None)
    s.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
    s.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
    s.override("embed.*", "tensor").override("head.weight", "tensor")
    return s


def batches(first: int, count: int):
    """Batches number first..first+count-1 of one fixed sequence (every process makes the same)."""
    rng = np.random.default_rng(7)
    out = [(Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32)),
            Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32))) for _ in range(first + count)]
    return out[first:]


def adam(params):
    return nn.Adam(params, learning_rate=LR)


def global_values(cell, optimizer=None) -> dict:
    """name -> array of a plain or simulated model's parameters (global tensors) and optimizer
    Parameters (prefixed "opt:")."""
    out = {name: p.asnumpy() for name, p in cell.parameters_and_names()}
    if optimizer is not None:
        mine = {id(p) for p in optimizer.parameters}
        out.update({"opt:" + name: p.asnumpy() for name, p in optimizer.parameters_and_names() if id(p) not in mine})
    return out
