"""Activations: ReLU, GELU, SiLU, Tanh, Sigmoid, Softmax, LogSoftmax, LeakyReLU, Identity (modules and functions),
hardsigmoid, hardswish and glu (functions).

mint kernels are used where MindSpore 2.10 has them on CPU (relu, silu, sigmoid, tanh, softmax);
gelu, log_softmax and leaky_relu go through ops (their mint kernels are missing on CPU). tanh computes
float32 inputs in float64 on the CPU (common.in_float64 says why).
"""
import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call, expect, in_float64, ms_dtype
from mindspore_hyper.migrate.mappings.registry import Unsupported, function, method, module

aten = torch.ops.aten


@module(torch.nn.ReLU, "nn.ReLU")
def relu_module(m) -> str:
    return "nn.ReLU()"


@module(torch.nn.GELU, "nn.GELU")
def gelu_module(m: torch.nn.GELU) -> str:
    return f"nn.GELU(approximate={m.approximate == 'tanh'})"


@module(torch.nn.SiLU, "nn.SiLU")
def silu_module(m) -> str:
    return "nn.SiLU()"


@module(torch.nn.Tanh, "nn.Tanh")
def tanh_module(m) -> str:
    return "InFloat64OnCpu(nn.Tanh())"


@module(torch.nn.Sigmoid, "nn.Sigmoid")
def sigmoid_module(m) -> str:
    return "nn.Sigmoid()"


def _dim(m) -> int:
    if m.dim is None:
        raise Unsupported(f"{type(m).__name__}(dim=None) (implicit dimension) is deprecated in torch; give dim")
    return m.dim


@module(torch.nn.Softmax, "nn.Softmax")
def softmax_module(m: torch.nn.Softmax) -> str:
    return f"nn.Softmax(axis={_dim(m)})"


@module(torch.nn.LogSoftmax, "nn.LogSoftmax")
def log_softmax_module(m: torch.nn.LogSoftmax) -> str:
    return f"nn.LogSoftmax(axis={_dim(m)})"


@module(torch.nn.LeakyReLU, "nn.LeakyReLU")
def leaky_relu_module(m: torch.nn.LeakyReLU) -> str:
    return f"nn.LeakyReLU(alpha={m.negative_slope!r})"


@module(torch.nn.Identity, "nn.Identity")
def identity_module(m) -> str:
    return "nn.Identity()"


@function("mint.nn.functional.relu", F.relu, torch.relu, method("relu"), aten.relu)
def relu(self, inplace=False):
    return call("mint.nn.functional.relu", self)


@function("ops.gelu", F.gelu, aten.gelu)
def gelu(self, approximate="none"):
    expect(approximate, ("none", "tanh"), "approximate")
    return call("ops.gelu", self, approximate=approximate)


@function("mint.nn.functional.silu", F.silu, aten.silu)
def silu(self, inplace=False):
    return call("mint.nn.functional.silu", self)


@function("mint.sigmoid", torch.sigmoid, method("sigmoid"), aten.sigmoid)
def sigmoid(self):
    return call("mint.sigmoid", self)


@function("mint.tanh", torch.tanh, method("tanh"), aten.tanh)
def tanh(self):
    return in_float64("mint.tanh", self)


def _softmax_dtype(self, dtype):
    return self if dtype.value is None else f"ops.cast({self}, {ms_dtype(dtype.value)})"


@function("mint.softmax", F.softmax, torch.softmax, method("softmax"), aten.softmax)
def softmax(self, dim=None, _stacklevel=3, dtype=None):
    return call("mint.softmax", _softmax_dtype(self, dtype), dim=dim.const("dim"))


@function("ops.log_softmax", F.log_softmax, torch.log_softmax, method("log_softmax"), aten.log_softmax)
def log_softmax(self, dim=None, _stacklevel=3, dtype=None):
    return call("ops.log_softmax", _softmax_dtype(self, dtype), dim.const("dim"))


@function("ops.softplus", F.softplus, aten.softplus)
def softplus(self, beta=1.0, threshold=20.0):
    return call("ops.softplus", self, beta, threshold)


@function("mint.square", aten.square, torch.square, method("square"))
def square(self):
    return call("mint.square", self)


@function("ops.leaky_relu", F.leaky_relu, aten.leaky_relu)
def leaky_relu(self, negative_slope=0.01, inplace=False):
    return call("ops.leaky_relu", self, negative_slope)



@function("mint.nn.functional.hardsigmoid", aten.hardsigmoid, F.hardsigmoid)
def hardsigmoid(self, inplace=False):
    # relu6(x + 3) / 6; values and gradients equal torch's (measured on [-5, 5], the kinks at +-3 included)
    return call("mint.nn.functional.hardsigmoid", self)


@function("mint.nn.functional.hardswish", aten.hardswish, F.hardswish)
def hardswish(self, inplace=False):
    # x * relu6(x + 3) / 6 (PP-LCNet, MobileNet-v3); values equal torch's; the gradient too but at exactly x = -3
    # and 3, the kinks, where MindSpore takes the inner side's slope (-0.5, 1.5) and torch the outer's (0, 1)
    return call("mint.nn.functional.hardswish", self)


@function("mint.nn.functional.glu", aten.glu, F.glu)
def glu(self, dim=-1):
    # the first half along `dim` times the sigmoid of the second (Wav2Vec2-Conformer's convolution module, nn.GLU
    # traced to aten); mint's kernel runs on CPU, values and gradients equal torch's
    return call("mint.nn.functional.glu", self, dim=dim.const("dim"))


@function("mint.neg of ops.softplus of mint.neg", aten.log_sigmoid, F.logsigmoid)
def log_sigmoid(self):
    # log(sigmoid(x)) = -softplus(-x) (softplus is linear past its threshold, as torch's log_sigmoid is stable)
    return call("mint.neg", call("ops.softplus", call("mint.neg", self)))
