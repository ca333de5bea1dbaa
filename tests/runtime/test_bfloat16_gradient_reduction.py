"""bfloat16 compute copies of float32 master weights under `train_step` (issue 41 items 1 and 3):
a weight the model casts itself and one a `to_float(bfloat16)` Cell's kernel launch casts have
their data-parallel gradient sums taken on the float32 Parameter, once per step: every device's
and micro-batch's bfloat16 contribution cast to float32, added in float32, never rounded to
bfloat16 (Megatron's `grad_reduce_in_fp32`). Checked bit for bit against numpy on values chosen so
that every float32 step is exact (tests/runtime/cast_weights_case.py); the same case runs under
msrun in tests/runtime/distributed/test_train_options_msrun.py."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper import Layout, auto_parallelize
from cast_weights_case import LR, bf16, expected_gradient, train_one_step


@pytest.mark.parametrize("devices,micro_batches", [(2, 1), (4, 1), (2, 2), (4, 2)])
def test_cast_weights_are_summed_in_float32_once_per_step(clean_context, devices, micro_batches):
    clean_context.set_context(device_num=devices)
    model, optimizer, grads, start, x, c = train_one_step(devices, micro_batches)
    want = expected_gradient(x, c, devices, micro_batches)
    assert (bf16(want) != want).sum() >= 8, "the data must tell a float32 sum from a bfloat16 one"
    for name, got in grads.items():
        assert got.dtype == np.float32, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    # SGD's float32 step with lr = 0.5 on an exact gradient is exact
    np.testing.assert_array_equal(model.network.w.asnumpy(), start["w"] - np.float32(LR) * want)
    np.testing.assert_array_equal(model.network.inner.v.asnumpy(), start["inner.v"] - np.float32(LR) * want)
    # one float32 all-reduce per weight and step over data, whatever the micro-batch count, beside the
    # global norm's (float64 scalar); a ring sends 2 (n - 1) / n of each: two 8 x 4 float32 gradients
    report = model.report(optimizer)
    causes = report.comm_causes["backward"]["AllReduce"]["data"]
    assert causes == {"grad sync of w": 1, "grad sync of inner.v": 1, "grad norm": 1}, causes
    sums = report.comm_backward["AllReduce"]["data"]
    assert sums == {"count": 3, "bytes": 2 * (devices - 1) * (2 * 128 + 8) // devices,
                    "input_bytes": 2 * 128 + 8}, sums


class UpCast(nn.Cell):
    """loss = sum(c * float32(float64(x) @ float64(w))): a widening cast of the float32 weight."""

    def __init__(self, w):
        super().__init__()
        self.w = Parameter(Tensor(w), name="w")

    def construct(self, x, c):
        h = ops.matmul(x.astype(ms.float64), self.w.astype(ms.float64))
        return (h.astype(ms.float32) * c).sum()


def test_a_widening_cast_trains_like_one_device(clean_context):
    """A float32 weight read through a widening cast (float64) takes the ordinary path (summed in float64 after
    the move, not routed to the parameter's hook): on data 2 its gradient equals one device's float64 product
    rounded to float32, within one float32 rounding."""
    clean_context.set_context(device_num=2)
    rng = np.random.default_rng(0)
    w, x, c = (rng.standard_normal(s).astype(np.float32) for s in ((8, 4), (4, 8), (4, 4)))
    model = auto_parallelize(UpCast(w), Layout((2,), ("data",))(tensor_map=()))
    model.train_step(nn.SGD(model.optimizer_parameters(), learning_rate=0.5), Tensor(x), Tensor(c))
    want = (x.astype(np.float64).T @ c.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(model.last_gradients["w"], want, rtol=2.0 ** -23, atol=0)
