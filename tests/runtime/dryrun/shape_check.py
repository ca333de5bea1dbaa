"""Check every shape rule the dry run would use against MindSpore's real op: while a model runs in
simulation, each op's local call is also inferred from MetaTensors of its inputs and the inferred
shapes and dtypes are compared with what the real kernel returned."""
import contextlib

from mindspore import Tensor

from mindspore_hyper.dtensor import dispatch
from mindspore_hyper.dtensor.meta import meta
from mindspore_hyper.dtensor.shape_registry import infer


def _as_meta(v):
    if isinstance(v, Tensor):
        return meta(tuple(v.shape), v.dtype)
    if isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
        return type(v)(_as_meta(x) for x in v)
    return v


def signature(out):
    if isinstance(out, (tuple, list)):
        return [signature(o) for o in out]
    if isinstance(out, Tensor):
        return (tuple(out.shape), out.dtype)
    return out


@contextlib.contextmanager
def checking_shape_rules():
    """Inside the block, every real local op is also inferred; yields the list of
    (op name, real signature, inferred signature or the rule's error) that differ."""
    mismatches, checked = [], set()
    original = dispatch.OpCall.run

    def run(self, local_inputs, local_kwargs=None):
        out = original(self, local_inputs, local_kwargs)
        kwargs = self.kwargs if local_kwargs is None else local_kwargs
        inputs = [_as_meta(v) for v in local_inputs]
        args = (self.prim, self.prim_name, tuple(inputs)) if self.prim is not None else tuple(inputs)
        try:
            inferred = signature(infer(self.func, args, {k: _as_meta(v) for k, v in kwargs.items()}, name=self.name))
        except Exception as error:  # a missing or failing rule
            inferred = f"{type(error).__name__}: {str(error)[:160]}"
        real = signature(out)
        checked.add(self.name)
        if inferred != real:
            mismatches.append((self.name, real, inferred))
        return out

    dispatch.OpCall.run = run
    try:
        yield mismatches, checked
    finally:
        dispatch.OpCall.run = original
