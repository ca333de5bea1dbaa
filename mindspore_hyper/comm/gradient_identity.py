"""Identity in forward whose backward computes the input's gradient with a given function: one
node of MindSpore's PyNative autograd graph (MindSpore's custom autograd function, torch's
`autograd.Function`), which both `mindspore.value_and_grad` and `run_backward` (torch-style
`loss.backward()`) differentiate, where `run_backward` cannot run a Cell's custom `bprop`."""
from typing import Callable

from mindspore import Tensor, ops
from mindspore.common import _Function

__all__ = ["identity_with_gradient", "cast_with_gradient_to"]


def identity_with_gradient(x: Tensor, backward: Callable[[Tensor], Tensor]) -> Tensor:
    """`x` unchanged; in the backward, `backward(dout)` is `x`'s gradient.

    Args:
        x: the tensor passed through.
        backward: the output's gradient -> the input's gradient (it may move bytes or record).

    Returns:
        `x`, as a new node of the autograd graph.
    """
    return _GradientIdentityNode.apply(x, backward)


class _GradientIdentityNode(_Function):
    @staticmethod
    def forward(ctx, x, backward):  # pylint: disable=arguments-differ
        ctx.backward_fn = backward
        return x

    @staticmethod
    def backward(ctx, dout):  # pylint: disable=arguments-differ
        return ctx.backward_fn(dout), None


def cast_with_gradient_to(cast: Tensor, source: Tensor) -> Tensor:
    """`cast` (a dtype cast of `source`'s value, computed elsewhere) unchanged; in the backward its
    gradient goes to `source`, cast to `source`'s dtype as Cast's backward casts it, and none to
    `cast`: the cast's gradient taken through another path to the same value.

    Args:
        cast: the forward value (a cast of `source`).
        source: the tensor the gradient flows to.

    Returns:
        `cast`, as a new node of the autograd graph.
    """
    return _CastGradientNode.apply(cast, source)


class _CastGradientNode(_Function):
    @staticmethod
    def forward(ctx, cast, source):  # pylint: disable=arguments-differ
        ctx.source_dtype = source.dtype
        return cast

    @staticmethod
    def backward(ctx, dout):  # pylint: disable=arguments-differ
        return ops.zeros_like(dout), ops.cast(dout, ctx.source_dtype)
