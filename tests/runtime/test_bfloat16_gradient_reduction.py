"""Self-cast bfloat16 weights under `train_step` (issue 41 item 1): a float32 Parameter the model
casts to bfloat16 itself (`w.astype(ms.bfloat16)`) has its data-parallel gradient summed at the
bfloat16 copy, and the float32 gradient the optimizer gets is that sum through the cast's backward.
On data 2 in simulation the sum of the two ranks' bfloat16 contributions is rounded to bfloat16
once, which is the float32 reduction cast back (what msrun's transports do for bfloat16: reduce in
float32, round once). Checked bit for bit against numpy on values chosen so that every float32
step is exact and only the bfloat16 roundings round (see `_data`)."""
import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper import Layout, auto_parallelize


def _bf16(a: np.ndarray) -> np.ndarray:
    """numpy float32 rounded to bfloat16, to nearest, ties to even (MindSpore's Cast), as float32."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def _data():
    """bfloat16-exact operands in [0.5, 1): a product of two has <= 16 significant bits and a sum
    of two products (2 rows per rank) stays within float32's 24 bits, so the float32 kernels are
    exact and only the roundings to bfloat16 round; the same holds for the ranks' float32 sum."""
    rng = np.random.default_rng(4)
    pick = lambda shape: _bf16(rng.uniform(0.5, 1.0, shape).astype(np.float32))  # noqa: E731
    return pick((8, 4)), pick((4, 8)), pick((4, 4))  # w, x (batch 4: 2 rows per rank), the loss weights c


class SelfCast(nn.Cell):
    """loss = sum(c * float32(bfloat16(x) @ bfloat16(w))): the model casts its float32 weight itself."""

    def __init__(self, w: np.ndarray):
        super().__init__()
        self.w = Parameter(Tensor(w), name="w")

    def construct(self, x, c):
        h = ops.matmul(x.astype(ms.bfloat16), self.w.astype(ms.bfloat16))
        return (h.astype(ms.float32) * c).sum()


def test_self_cast_bf16_gradients_are_summed_in_float32_and_rounded_once_on_data_2(clean_context):
    clean_context.set_context(device_num=2, cpu_bfloat16="emulate")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    w, x, c = _data()
    model = auto_parallelize(SelfCast(w), Layout((2,), ("data",))(tensor_map=()))
    optimizer = nn.SGD(model.optimizer_parameters(), learning_rate=0.5)
    loss = model.train_step(optimizer, Tensor(x), Tensor(c))

    # each rank's contribution: its rows' x^T c from the emulated MatMul's float32 backward,
    # rounded to the bfloat16 copy's dtype; the two summed and rounded once; float32 through the cast
    parts = [_bf16(x[r * 2:(r + 1) * 2].T @ c[r * 2:(r + 1) * 2]) for r in range(2)]
    want = _bf16(parts[0] + parts[1])
    got = model.last_gradients["w"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.network.w.asnumpy(), w - np.float32(0.5) * want)  # exact: see _data
    # the loss: each rank's bfloat16 product (float32 exact, rounded once) times c, summed in float32;
    # the float32 sums of 32 terms in another order: within 32 * 2^-24 relative
    h = _bf16(x @ w)
    np.testing.assert_allclose(float(loss), float((h * c).sum()), rtol=32 * 2.0 ** -24)
