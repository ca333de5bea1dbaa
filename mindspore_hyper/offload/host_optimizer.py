"""Optimizer updates computed on the host, for offload units updated while the backward still runs.

MindSpore's optimizer Cells synchronize PyNative's kernel stream when called (``nn.Adam`` and
``nn.SGD`` run their ``construct`` under ``@jit``; eagerly, assigning their step Parameters
synchronizes too), so calling one in the middle of the backward stalls it. For the optimizers
below the same element-wise update is computed with numpy on a host thread instead, from the
stored parameters and states and the gradient copied out of the kernel stream, as ZeRO-Offload
runs Adam on the host CPU where the states live. Other optimizers (or options) have no rule:
their units are updated after the backward by the optimizer Cell itself.

The formulas are those of MindSpore's CPU kernels (``Adam``, ``SGD``), in float32 (other
parameter dtypes have no rule); the results agree with the optimizer Cells to float32 rounding
(`tests/test_host_optimizer.py`).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from mindspore import Parameter, nn
from mindspore.common import dtype as mstype

from mindspore_hyper import _core

__all__ = ["HostRule", "host_rule"]


class HostRule:
    """One optimizer step on numpy arrays, in place.

    `states` are the values of the workspace optimizer's state Parameters, in the order the
    workspace lists them (`Workspace.states`); `params` and `grads` are parallel lists.
    """

    def step(self, params: List[np.ndarray], states: List[np.ndarray], grads: Sequence[np.ndarray]) -> None:
        raise NotImplementedError


def _f32(tensor) -> np.float32:
    return np.float32(tensor.asnumpy().reshape(-1)[0]) if hasattr(tensor, "asnumpy") else np.float32(tensor)


def _plain(optimizer: nn.Optimizer) -> bool:
    """No option changing the gradient before the kernel (weight decay, loss scale, grad
    centralization), one learning rate, fixed."""
    return not (optimizer.is_group or optimizer.dynamic_lr or optimizer.exec_weight_decay
                or optimizer.need_scale or optimizer.grad_centralization)


class _Adam(HostRule):
    def __init__(self, opt: nn.Adam, index):
        self.m = [index(p) for p in opt.moment1]
        self.v = [index(p) for p in opt.moment2]
        self.beta1_power, self.beta2_power = index(opt.beta1_power), index(opt.beta2_power)
        self.global_step, self.lr = index(opt.global_step), index(opt.learning_rate)
        self.beta1, self.beta2, self.eps = _f32(opt.beta1), _f32(opt.beta2), _f32(opt.eps)
        self.nesterov = bool(opt.use_nesterov)

    def step(self, params, states, grads):
        one = np.float32(1)
        b1p = states[self.beta1_power]
        b2p = states[self.beta2_power]
        b1p *= self.beta1
        b2p *= self.beta2
        states[self.global_step] += 1
        lr = np.float32(states[self.lr].reshape(-1)[0])
        lr_t = np.float32(lr * np.sqrt(one - b2p.reshape(-1)[0]) / (one - b1p.reshape(-1)[0]))
        for param, g, mi, vi in zip(params, grads, self.m, self.v):
            m, v = states[mi], states[vi]
            if all(a.dtype == np.float32 and a.flags.c_contiguous for a in (param, g, m, v)):
                # one pass in C++, the GIL released (numpy below: ~8x the time in temporaries)
                _core.adam_step(param, m, v, g, lr_t, self.beta1, self.beta2, self.eps, self.nesterov)
                continue
            m += (g - m) * (one - self.beta1)
            v += (g * g - v) * (one - self.beta2)
            num = m * self.beta1 + (one - self.beta1) * g if self.nesterov else m
            param -= lr_t * num / (self.eps + np.sqrt(v))


class _SGD(HostRule):
    def __init__(self, opt: nn.SGD, index):
        self.accum = [index(p) for p in opt.accum]
        self.stat = [index(p) for p in opt.stat]
        self.global_step, self.lr = index(opt.global_step), index(opt.learning_rate)
        self.momentum_index = index(opt.momentum)
        self.dampening = np.float32(opt.dampening)
        self.nesterov = bool(opt.nesterov)

    def step(self, params, states, grads):
        states[self.global_step] += 1
        lr = np.float32(states[self.lr].reshape(-1)[0])
        momentum = np.float32(states[self.momentum_index].reshape(-1)[0])
        for param, g, ai, si in zip(params, grads, self.accum, self.stat):
            update = g
            if momentum > 0:
                accum, stat = states[ai], states[si]
                fresh = stat > 0
                np.copyto(accum, np.where(fresh, g, accum * momentum + (np.float32(1) - self.dampening) * g))
                update = g + momentum * accum if self.nesterov else accum
            param -= lr * update
            if momentum > 0:
                states[si][...] = 0


def host_rule(optimizer: nn.Cell, states: Sequence[Parameter]) -> Optional[HostRule]:
    """The host rule computing `optimizer`'s update, or None if there is none (see module doc).

    Args:
        optimizer: the workspace's optimizer instance.
        states: its state Parameters, in the order the host rule receives their values.
    """
    if any(p.dtype != mstype.float32 for p in optimizer.parameters):
        return None  # the rules are checked in float32 only
    position = {id(s): i for i, s in enumerate(states)}

    def index(p) -> int:
        return position[id(p)]

    try:
        if type(optimizer) is nn.Adam and _plain(optimizer) and not (
                optimizer.use_lazy or optimizer.use_offload or optimizer.use_amsgrad):
            return _Adam(optimizer, index)
        if type(optimizer) is nn.SGD and _plain(optimizer):
            return _SGD(optimizer, index)
    except (KeyError, AttributeError):  # a state not among `states`, or another MindSpore version
        return None
    return None
