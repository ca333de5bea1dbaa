"""Ring attention's core (`ring_core.RingAttention`, the math both simulation and msrun run) with
every member in this process (`LocalRing`): forward and its hand-written backward equal
MindSpore's autodiff of plain attention (causal, padding, attention-mask and no mask; cp 2 and
4; contiguous and zigzag chunks); masked-out blocks are skipped in both passes, zigzag balances
them; each pass's shifts overlap its blocks; what the forward keeps; the bytes a device sends,
per pass."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, ops

from mindspore_hyper.dtensor.context_parallel.ring_core import RingAttention, RingPlan
from mindspore_hyper.dtensor.context_parallel.ring_transports import LocalRing
from mindspore_hyper.dtensor.context_parallel.scores import MASKED_BELOW, Step

pytestmark = pytest.mark.usefixtures("pynative")

B, H, T, D = 2, 3, 16, 4
RNG = np.random.default_rng(0)


def _masks():
    """name -> (steps, what each member's mask of each step is): the examples' GPT (divide,
    additive -1e9 causal), converted scaled_dot_product_attention (multiply, fill a bool causal
    mask with -inf), nn.MultiheadAttention with a key padding mask (additive -inf [b, 1, 1, s],
    sequences padded from 5 and 12 on), an attention mask (additive, random -inf), none."""
    causal = np.triu(np.ones((T, T), bool), 1)
    padding = np.zeros((B, 1, 1, T), np.float32)
    padding[0, ..., 5:] = -np.inf
    padding[1, ..., 12:] = -np.inf  # positions 12-15 are padding in both: their key blocks are skipped
    attn = np.where(RNG.random((T, T)) < 0.3, -np.inf, 0).astype(np.float32)
    np.fill_diagonal(attn, 0)
    return {
        "causal add": ((Step("div", 2.0), Step("add", mask=True)),
                       [None, Tensor(np.where(causal, -1e9, 0).astype(np.float32))]),
        "causal fill": ((Step("mul", 0.5), Step("fill", float("-inf"), mask=True)), [None, Tensor(causal)]),
        "padding": ((Step("mul", 0.5), Step("add", mask=True)), [None, Tensor(padding)]),
        "attention mask": ((Step("add", mask=True),), [Tensor(attn)]),
        "none": ((Step("div", 2.0),), [None]),
    }


MASKS = _masks()


def _empty_blocks(steps, masks, chunks):
    scores = np.zeros((1, 1, T, T), np.float32)
    for step, mask in zip(steps, masks):
        scores = step.apply_numpy(scores, None if mask is None else mask.asnumpy())
    size = T // chunks
    return np.array([[np.all(scores[..., i * size:(i + 1) * size, j * size:(j + 1) * size] <= MASKED_BELOW)
                      for j in range(chunks)] for i in range(chunks)])


def _reference(q, k, v, steps, masks):
    scores = ops.matmul(q, k.swapaxes(-1, -2))
    for step, mask in zip(steps, masks):
        scores = step.apply(scores, mask)
    return ops.matmul(ops.softmax(scores, -1), v)


def _core(steps, masks, n, per_rank, transport):
    """A RingAttention cell over n members in this process."""
    plan = RingPlan(n, tuple(range(n)), per_rank, steps, _empty_blocks(steps, masks, n * per_rank), (T, T))
    return RingAttention(plan, transport, [masks] * n)


def _apply(core, q, k, v):
    """The cell on contiguous shards of q, k^T, v; the members' outputs concatenated."""
    n = core.plan.size
    qs, kts, vs = ops.split(q, T // n, 2), ops.split(k.swapaxes(-1, -2), T // n, 3), ops.split(v, T // n, 2)
    return ops.concat(core(*[x for r in range(n) for x in (qs[r], kts[r], vs[r])], *core.graded_masks()), 2)


def _ring(q, k, v, steps, masks, n, per_rank, records=None):
    """The ring over n members (contiguous shards in, out concatenated) and its RingAttention cell."""
    record = (lambda nbytes, backward: None) if records is None else \
        (lambda nbytes, backward: records[backward].append(nbytes))
    core = _core(steps, masks, n, per_rank, LocalRing(record))
    return _apply(core, q, k, v), core


@pytest.mark.parametrize("n, per_rank", [(2, 1), (2, 2), (4, 1), (4, 2)])
@pytest.mark.parametrize("mask", list(MASKS))
def test_forward_and_backward_equal_autodiff_of_plain_attention(mask, n, per_rank):
    steps, masks = MASKS[mask]
    q, k, v, weights = (Tensor(RNG.standard_normal((B, H, T, D)).astype(np.float32)) for _ in range(4))
    loss = lambda fn: lambda *qkv: (fn(*qkv) * weights).sum()  # noqa: E731
    want, want_grads = ms.value_and_grad(loss(lambda *x: _reference(*x, steps, masks)), (0, 1, 2))(q, k, v)
    got, grads = ms.value_and_grad(loss(lambda *x: _ring(*x, steps, masks, n, per_rank)[0]), (0, 1, 2))(q, k, v)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    for name, g, w in zip("qkv", grads, want_grads):
        w = w.asnumpy()
        np.testing.assert_allclose(g.asnumpy(), w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=name)


@pytest.mark.parametrize("n, per_rank", [(2, 1), (2, 2), (4, 2)])
def test_a_tracked_additive_mask_gets_its_gradient(n, per_rank):
    """A learned bias [1, h, t, t] and a key bias [b, 1, 1, s] that autodiff tracks (inputs here;
    parameters in a model) get the gradient plain attention gives them; the constant causal mask
    beside them stays a constant of the cell."""
    causal = Tensor(np.where(np.triu(np.ones((T, T), bool), 1), -1e9, 0).astype(np.float32))
    steps = (Step("div", 2.0), Step("add", mask=True), Step("add", mask=True), Step("add", mask=True))
    q, k, v, weights = (Tensor(RNG.standard_normal((B, H, T, D)).astype(np.float32)) for _ in range(4))
    bias = Tensor(RNG.standard_normal((1, H, T, T)).astype(np.float32))
    key_bias = Tensor(RNG.standard_normal((B, 1, 1, T)).astype(np.float32))
    cores = []

    def ring(q, k, v, bias, key_bias):
        out, core = _ring(q, k, v, steps, [None, bias, key_bias, causal], n, per_rank)
        cores.append(core)
        return (out * weights).sum()

    def reference(q, k, v, bias, key_bias):
        return (_reference(q, k, v, steps, [None, bias, key_bias, causal]) * weights).sum()

    want, want_grads = ms.value_and_grad(reference, (0, 1, 2, 3, 4))(q, k, v, bias, key_bias)
    got, grads = ms.value_and_grad(ring, (0, 1, 2, 3, 4))(q, k, v, bias, key_bias)
    assert cores[0].graded == [(m, k) for m in range(n) for k in (1, 2)]  # not the causal constant
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    for name, g, w in zip(("q", "k", "v", "bias", "key bias"), grads, want_grads):
        w = w.asnumpy()
        np.testing.assert_allclose(g.asnumpy(), w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=name)


@pytest.mark.parametrize("n, per_rank, blocks", [(2, 1, [1, 2]), (2, 2, [5, 5]), (4, 2, [9, 9, 9, 9])])
def test_causal_blocks_are_skipped_in_both_passes_and_zigzag_balances_them(n, per_rank, blocks):
    """Of (n * per_rank)^2 blocks only the causal ones are computed: contiguous chunks load member
    r with r + 1 of them, zigzag gives every member the same count."""
    steps, masks = MASKS["causal add"]
    q, k, v = (Tensor(RNG.standard_normal((B, H, T, D)).astype(np.float32)) for _ in range(3))
    cores = []

    def loss(*qkv):
        out, core = _ring(*qkv, steps, masks, n, per_rank)
        cores.append(core)
        return out.sum()

    ms.value_and_grad(loss, (0, 1, 2))(q, k, v)
    assert cores[0].computed == {"forward": blocks, "backward": blocks}


class _Overlap:
    """A transport that notes, per shift, the blocks its ring had computed in that pass when the
    shift was posted and when it was waited for."""

    def __init__(self, transport):
        self.transport, self.core, self.shifts = transport, None, []

    def blocks(self, phase):
        return sum(self.core.computed[phase])

    def shift(self, tensors, phase):
        handle, shift = self.transport.shift(tensors, phase), [phase, self.blocks(phase), None]
        self.shifts.append(shift)
        spy = self

        class Waited:
            def wait(self):
                if shift[2] is None:  # the first wait: where the caller blocks for the transfer
                    shift[2] = spy.blocks(phase)
                return handle.wait()

        return Waited()

    def permute(self, chunks, sources, phase):
        return self.transport.permute(chunks, sources, phase)


@pytest.mark.parametrize("n", [2, 4])
def test_every_shift_but_the_last_is_posted_before_blocks_and_waited_for_after_them(n):
    """Forward: n-1 K/V shifts; backward: n shifts of K/V and/or accumulators, each posted before
    its step's blocks are computed and waited for after them, then the accumulators' way home."""
    steps, masks = MASKS["none"]
    q, k, v = (Tensor(RNG.standard_normal((B, H, T, D)).astype(np.float32)) for _ in range(3))
    spy = _Overlap(LocalRing(lambda nbytes, backward: None))
    spy.core = _core(steps, masks, n, 1, spy)
    ms.value_and_grad(lambda *qkv: _apply(spy.core, *qkv).sum(), (0, 1, 2))(q, k, v)
    shifts = spy.shifts
    assert [phase for phase, _, _ in shifts] == ["forward"] * (n - 1) + ["backward"] * (n + 1)
    for phase, posted, waited in shifts[:-1]:
        assert waited > posted, (phase, posted, waited)  # blocks computed while the shift was under way
    assert shifts[-1][1:] == [n * n, n * n]  # the accumulators' last shift: after every block


def test_padding_blocks_are_skipped():
    steps, masks = MASKS["padding"]
    q, k, v = (Tensor(RNG.standard_normal((B, H, T, D)).astype(np.float32)) for _ in range(3))
    _, core = _ring(q, k, v, steps, masks, 2, 1)
    assert core.computed["forward"] == [2, 2]  # key chunk 1 (positions 8-15) is not all padding in sequence 1
    _, core = _ring(q, k, v, steps, masks, 4, 1)
    assert core.computed["forward"] == [3] * 4  # key chunk 3 (positions 12-15) is padding in both


def test_a_query_chunk_with_every_key_masked_is_refused():
    skip = np.zeros((4, 4), bool)
    skip[2] = True
    with pytest.raises(ValueError, match="every key of query chunk 2 \\(of 4\\) is masked out"):
        RingPlan(2, (0, 1), 2, (), skip, (T, T))


def test_the_forward_keeps_its_chunks_and_the_rows_log_sum_exp_only():
    steps, masks = MASKS["causal add"]
    q, k, v = (Tensor(RNG.standard_normal((B, H, T, D)).astype(np.float32)) for _ in range(3))
    _, core = _ring(q, k, v, steps, masks, 4, 2)
    saved = core.saved
    chunk = T // 8
    for name, per_member, shape in (("q", saved.q, (B, H, chunk, D)), ("kt", saved.kt, (B, H, D, chunk)),
                                    ("v", saved.v, (B, H, chunk, D)), ("lse", saved.lse, (B, H, chunk, 1))):
        assert [[tuple(c.shape) for c in m] for m in per_member] == [[shape] * 2] * 4, name
    # the log-sum-exp of each row: lse of zigzag chunk 7 (member 0's second) against the scores
    scores = ops.matmul(q, k.swapaxes(-1, -2)).asnumpy() / 2 + masks[1].asnumpy()
    rows = scores[..., 7 * chunk:, :]
    want = rows.max(-1, keepdims=True) + np.log(np.exp(rows - rows.max(-1, keepdims=True)).sum(-1, keepdims=True))
    np.testing.assert_allclose(saved.lse[0][1].asnumpy(), want, rtol=1e-5)


@pytest.mark.parametrize("per_rank", [1, 2])
def test_recorded_bytes_are_what_a_device_sends_per_pass(per_rank):
    """Forward: n-1 K/V shifts (and, zigzag, q/k/v chunks out and an output chunk back per
    device); backward: n-1 K/V shifts and n accumulator shifts (and, zigzag, the output gradient
    with its row sums in, q/k/v gradient chunks back)."""
    n = 4
    steps, masks = MASKS["causal add"]
    q, k, v = (Tensor(RNG.standard_normal((B, H, T, D)).astype(np.float32)) for _ in range(3))
    records = {False: [], True: []}
    ms.value_and_grad(lambda *x: _ring(*x, steps, masks, n, per_rank, records)[0].sum(), (0, 1, 2))(q, k, v)
    shard = B * H * (T // n) * D * 4  # bytes of one device's q, k^T or v shard
    chunk, rows = shard // per_rank, B * H * (T // n) // per_rank * 4
    moved = 2 if per_rank == 2 else 0  # zigzag over 4: member 1 keeps none of its two chunks
    assert sum(records[False]) == (n - 1) * 2 * shard + moved * (3 * chunk + chunk)
    assert sum(records[True]) == (2 * n - 1) * 2 * shard + moved * (chunk + rows + 3 * chunk)
