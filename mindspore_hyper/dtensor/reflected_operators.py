"""Python operators a DTensor must define itself: the reflected ones and the comparisons.

A plain Tensor on the LEFT of an operator with a DTensor on the right (`x - d`) would not reach
the DTensor's `__fallback__`: MindSpore raises "Cannot found __fallback__ attr from object
Tensor". Python tries a subclass's reflected method first, so defining them here routes such
expressions through the functional op, which the DTensor intercepts. The comparisons likewise go
through the functional ops (and answer `d == None` as Python does).
"""
from __future__ import annotations

from mindspore import ops

__all__ = ["ReflectedOperators"]


def _bool():
    import mindspore as ms

    return ms.bool_


class ReflectedOperators:
    """Mixin of `DTensor` (listed before `mindspore.Tensor` among its bases, so these win)."""

    def __radd__(self, other):
        return ops.add(other, self)

    def __rsub__(self, other):
        return ops.sub(other, self)

    def __rmul__(self, other):
        return ops.mul(other, self)

    def __rtruediv__(self, other):
        return ops.div(other, self)

    def __rfloordiv__(self, other):
        return ops.floor_div(other, self)

    def __rmod__(self, other):
        return ops.floor_mod(other, self)

    def __rpow__(self, other):
        return ops.pow(other, self)

    def __rmatmul__(self, other):
        return ops.matmul(other, self)

    def __rand__(self, other):
        return ops.logical_and(other, self) if self.dtype == _bool() else ops.bitwise_and(other, self)

    def __ror__(self, other):
        return ops.logical_or(other, self) if self.dtype == _bool() else ops.bitwise_or(other, self)

    def __rxor__(self, other):
        return ops.logical_xor(other, self) if self.dtype == _bool() else ops.bitwise_xor(other, self)

    def __lt__(self, other):
        return ops.less(self, other)

    def __le__(self, other):
        return ops.less_equal(self, other)

    def __gt__(self, other):
        return ops.greater(self, other)

    def __ge__(self, other):
        return ops.greater_equal(self, other)

    def __eq__(self, other):
        return False if other is None else ops.equal(self, other)

    def __ne__(self, other):
        return True if other is None else ops.not_equal(self, other)
