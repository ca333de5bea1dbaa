"""Normalisation: LayerNorm, BatchNorm1d/2d, GroupNorm modules; functional layer_norm, group_norm, rms_norm and
weight norm (`torch._weight_norm`, what `torch.nn.utils.parametrizations.weight_norm` computes at each access).

torch and MindSpore differ in defaults: BatchNorm momentum is the weight of the new statistic in
torch (0.1) and of the old one in MindSpore (0.9), so m becomes 1 - m; nn.LayerNorm's epsilon
defaults to 1e-7 in MindSpore and 1e-5 in torch. The constructors below always pass both. MindSpore's
nn.LayerNorm always trains gamma and beta, so a torch LayerNorm without weight or bias is not mapped (its traced
program, the layer_norm helper with the missing term constant, is generated instead).
"""
import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call, literal, sizes
from mindspore_hyper.migrate.mappings.registry import Unsupported, function, module

aten = torch.ops.aten

_NORM_PARAMS = {"weight": "gamma", "bias": "beta"}
_BN_PARAMS = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}


@module(torch.nn.LayerNorm, "nn.LayerNorm", params=_NORM_PARAMS,
        accepts=lambda m: m.weight is not None and m.bias is not None)  # nn.LayerNorm always trains both
def layer_norm_module(m: torch.nn.LayerNorm) -> str:
    n = len(m.normalized_shape)
    return (f"nn.LayerNorm({tuple(m.normalized_shape)}, begin_norm_axis={-n}, begin_params_axis={-n}, "
            f"epsilon={m.eps!r})")


def _batch_norm(m, cls: str) -> str:
    if m.momentum is None:
        raise Unsupported(f"{type(m).__name__}(momentum=None) (a cumulative moving average) has no MindSpore "
                          "equivalent; set a momentum")
    use_batch_statistics = "" if m.track_running_stats else ", use_batch_statistics=True"
    return (f"nn.{cls}({m.num_features}, eps={m.eps!r}, momentum={1.0 - m.momentum!r}, "
            f"affine={m.affine}{use_batch_statistics})")


@module(torch.nn.BatchNorm1d, "nn.BatchNorm1d", params=_BN_PARAMS)
def batch_norm1d_module(m: torch.nn.BatchNorm1d) -> str:
    return _batch_norm(m, "BatchNorm1d")


@module(torch.nn.BatchNorm2d, "nn.BatchNorm2d", params=_BN_PARAMS)
def batch_norm2d_module(m: torch.nn.BatchNorm2d) -> str:
    return _batch_norm(m, "BatchNorm2d")


@module(torch.nn.GroupNorm, "nn.GroupNorm", params=_NORM_PARAMS)
def group_norm_module(m: torch.nn.GroupNorm) -> str:
    return f"nn.GroupNorm({m.num_groups}, {m.num_channels}, eps={m.eps!r}, affine={m.affine})"


@function("ops.LayerNorm (helper layer_norm)", F.layer_norm, aten.layer_norm)
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    # mint.nn.functional.layer_norm has no CPU kernel; the helper calls the LayerNorm primitive.
    return call("layer_norm", input, sizes([normalized_shape]), weight, bias, eps)


@function("mint.nn.functional.group_norm", F.group_norm, aten.group_norm)
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    return call("mint.nn.functional.group_norm", input, num_groups, weight, bias, eps)


@function("mint.rsqrt of mint.mean (a composition)", F.rms_norm, aten.rms_norm)
def rms_norm(input, normalized_shape, weight=None, eps=None):
    # torch: x * rsqrt(mean(x^2 over the normalised dimensions) + eps) * weight, eps None -> the dtype's epsilon;
    # mint's RmsNorm has no CPU kernel
    n = len(normalized_shape.items if normalized_shape.items is not None else normalized_shape.const("normalized_shape"))
    epsilon = eps if eps.value is not None else literal(float(torch.finfo(input.dtype or torch.float32).eps))
    dims = tuple(range(-n, 0))
    mean = call("mint.mean", call("mint.mul", input, input), dim=dims, keepdim=True)
    normed = call("mint.mul", input, call("mint.rsqrt", call("mint.add", mean, epsilon)))
    return normed if weight.value is None and not weight.is_tensor else call("mint.mul", normed, weight)


@function("mint.mul / mint.div by mint.sqrt of mint.sum (a composition)", torch._weight_norm, aten._weight_norm)
def weight_norm(v, g, dim=0):
    # torch.nn.utils.parametrizations.weight_norm: v * (g / ||v||), the L2 norm over every dimension of v but `dim`
    # (torch.norm_except_dim, where dim=-1 means over every dimension), kept for broadcasting against v
    d = dim.const("dim")
    n = v.ndim
    dims = tuple(range(n)) if d == -1 else tuple(i for i in range(n) if i != d % n)
    norm = (call("mint.sqrt", call("mint.sum", call("mint.mul", v, v), dim=dims, keepdim=True)) if dims
            else call("mint.abs", v))  # a 1-D weight normalised along its only dimension: |v| per element
    return call("mint.mul", v, call("mint.div", g, norm))
