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
from mindspore_hyper.checkpoint.directory import resolve_step  # noqa: E402

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


def dense_stack():
    """MindSpore's own layers (Dense, LayerNorm, ReLU) with a loss: few tensors, small."""
    net = nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.LayerNorm((32,)), nn.Dense(32, 8))
    return nn.WithLossCell(net, nn.MSELoss())


def dense_strategy(data: int, tensor: int):
    """Column then row tensor parallelism over `tensor`, data parallelism and ZeRO-1 over `data`."""
    s = Layout((data, tensor), ("data", "tensor"))(tensor_map=(), optimizer_state="data")
    return s.override("*.0.*", "tensor").override("*.3.weight", None, "tensor")


def simulated_dense(devices: int, data: int, tensor: int, seed: int):
    """`dense_stack` on `devices` simulated devices (context set) with `dense_strategy` and Adam:
    (model, parallel model, optimizer)."""
    import mindspore as ms

    import mindspore_hyper as mh

    mh.reset_context()
    mh.set_context(device_num=devices)
    ms.set_seed(seed)
    model = dense_stack()
    par = mh.auto_parallelize(model, dense_strategy(data, tensor))
    return model, par, adam(par.optimizer_parameters())


def dense_reference(start: dict, first: int, total: int):
    """The uninterrupted reference: `dense_stack` on one device from the values `start` (as
    `global_values` gives them: parameters and "opt:" Adam states), trained on the batches of
    steps first..total-1: (values, {step: loss})."""
    import mindspore as ms

    model = dense_stack()
    optimizer = adam(model.trainable_params())
    mine = {id(p) for p in optimizer.parameters}
    states = [("opt:" + n, p) for n, p in optimizer.parameters_and_names() if id(p) not in mine]
    for key, p in list(model.parameters_and_names()) + states:
        p.set_data(Tensor(start[key]))
    grad = ms.value_and_grad(model, None, optimizer.parameters)
    losses = {}
    for step in range(first, total):
        loss, grads = grad(*dense_batches(step, 1)[0])
        optimizer(grads)
        losses[step] = float(loss.asnumpy())
    return global_values(model, optimizer), losses


def dense_batches(first: int, count: int):
    """Batches first..first+count-1 of a fixed sequence for `dense_stack` (inputs, targets)."""
    rng = np.random.default_rng(11)
    out = [(Tensor(rng.standard_normal((8, 16)).astype(np.float32)),
            Tensor(rng.standard_normal((8, 8)).astype(np.float32))) for _ in range(first + count)]
    return out[first:]


def batches(first: int, count: int):
    """Batches number first..first+count-1 of one fixed sequence (every process makes the same)."""
    rng = np.random.default_rng(7)
    out = [(Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32)),
            Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32))) for _ in range(first + count)]
    return out[first:]


def adam(params):
    return nn.Adam(params, learning_rate=LR)


def global_values(cell, optimizer=None) -> dict:
    """name -> copy of a plain or simulated model's parameters (global tensors) and optimizer
    Parameters (prefixed "opt:"). Copies: `asnumpy()` shares the Parameter's memory, which
    training updates in place."""
    out = {name: p.asnumpy().copy() for name, p in cell.parameters_and_names()}
    if optimizer is not None:
        mine = {id(p) for p in optimizer.parameters}
        out.update({"opt:" + name: p.asnumpy().copy() for name, p in optimizer.parameters_and_names()
                    if id(p) not in mine})
    return out


def step_dir(root, step=None):
    """The committed step directory a load of `root` reads (its newest step, or `step`)."""
    return type(root)(resolve_step(str(root), step)[1]) if not isinstance(root, str) else resolve_step(root, step)[1]


def held(par, optimizer):
    """What one process of a ParallelModel holds: name -> array and name -> region ([start, stop]
    per dimension of the global tensor); optimizer states are prefixed "opt:"."""
    arrays, regions = {}, {}
    params = dict(par.network.parameters_and_names())
    for row in par.table:
        arrays[row.name] = params[row.name].asnumpy().copy()
        regions[row.name] = [[s.start, s.stop] for s in par.held_region(row.name)]
    by_name = {params[row.name].name: row.name for row in par.table}  # Parameter.name -> path
    mine = {id(p) for p in optimizer.parameters}
    for name, p in optimizer.parameters_and_names():
        if id(p) in mine:
            continue
        key = "opt:" + name
        arrays[key] = p.asnumpy().copy()
        owner = max((n for n in by_name if name.endswith("." + n)), key=len, default=None)
        region = (par.held_region(by_name[owner], optimizer=True) if owner
                  else tuple(slice(0, n) for n in p.shape))
        regions[key] = [[s.start, s.stop] for s in region]
    return arrays, regions


def assemble(parts):
    """Global arrays put together from (arrays, regions) of several processes; every element
    must be covered (NaN or -1 marks a gap)."""
    values = {}
    for arrays, regions in parts:
        for name, region in regions.items():
            shape = [b for _, b in region]
            full = values.get(name)
            if full is None or full.shape != tuple(np.maximum(full.shape, shape)):
                grown = np.full(np.maximum(full.shape if full is not None else shape, shape),
                                np.nan if arrays[name].dtype.kind == "f" else -1, arrays[name].dtype)
                if full is not None:
                    grown[tuple(slice(0, n) for n in full.shape)] = full
                full = values[name] = grown
            full[tuple(slice(a, b) for a, b in region)] = arrays[name]
    return values
