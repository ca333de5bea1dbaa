"""The expert exchange's buffers in the memory accounting (`moe/exchange_buffers.py`): the
dispatch's send and receive buffers alive until the experts take their input, the combine's send
and receive buffers and weighted copies alive until the per-token sum, each expert member its
own under a routing histogram, equal in the dry run and the simulation and to a hand count."""
import numpy as np
import pytest
from mindspore import Tensor, nn

from mindspore_hyper import Layout
from mindspore_hyper.moe.exchange_buffers import combine_buffer_bytes, dispatch_buffer_bytes

from moe_models import MoENet, expert_strategy

# of each device's 16 token copies (8 tokens, top-2) experts 0..7 get 4, 4, 2, 2, 1, 1, 1, 1, so
# members 0..3 (2 experts each) get rows_to = 8, 4, 2, 2 from every device
SKEWED = [0.25, 0.25, 0.125, 0.125, 0.0625, 0.0625, 0.0625, 0.0625]


class Probe(nn.Cell):
    """MoENet's layer through the engine's steps, noting every device's live bytes: what the
    experts' step frees (the dispatch buffers; a forward without gradients keeps no expert
    activations) and the peak over the combine above the live bytes before it."""

    def __init__(self):
        super().__init__()
        self.net = MoENet(hidden=16, ffn=24, experts=8, top_k=2)
        self.freed, self.combine_peak = {}, {}

    def construct(self, x):
        engine = self.net.moe.parallel()
        h = self.net.inp(x)
        accounting = h.execution.accounting
        inputs = engine.dispatch(h)
        before = {r: accounting.for_rank(r).live_bytes for r in range(4)}
        outputs = engine.compute(inputs)
        self.freed = {r: before[r] - accounting.for_rank(r).live_bytes for r in range(4)}
        live = {r: accounting.for_rank(r).live_bytes for r in range(4)}
        for r in range(4):  # the peak from here on is the combine's
            accounting.for_rank(r).peak_bytes = live[r]
        y, _ = engine.combine(outputs)
        self.combine_peak = {r: accounting.for_rank(r).peak_bytes - live[r] for r in range(4)}
        return y


@pytest.mark.parametrize("routing", [SKEWED, "balanced"], ids=["histogram", "balanced"])
def test_exchange_buffers_counted_per_member_as_by_hand(pynative, routing):
    """Hand count (hidden 16, float32: 64 bytes a row; c = 16 copies a device routes, n = 4 x
    rows_to[m] rows member m's experts receive): dispatch (c + n) x 64, combine (n + 2c) x 64.
    Histogram: n = 32, 16, 8, 8 -> dispatch 3072, 2048, 1536, 1536 and combine 4096, 3072, 2560,
    2560 bytes; balanced: n = 16 on every member -> 2048 and 3072."""
    mh = pynative
    x = Tensor(np.random.default_rng(0).normal(size=(8, 4, 16)).astype(np.float32))  # 8 tokens a device
    figures = {}
    for mode in ("simulation", "dryrun"):
        mh.set_context(mode=mode, device_num=4, moe_routing=routing)
        probe = Probe()
        model = mh.auto_parallelize(probe, expert_strategy(Layout((4,), ("expert",))))
        model(x)
        figures[mode] = (probe.freed, probe.combine_peak)
    assert figures["simulation"] == figures["dryrun"]
    received = (32, 16, 8, 8) if routing == SKEWED else (16, 16, 16, 16)
    freed, combine = figures["dryrun"]
    assert freed == {r: (16 + n) * 64 for r, n in enumerate(received)}
    assert combine == {r: (n + 2 * 16) * 64 for r, n in enumerate(received)}
    assert freed == {r: dispatch_buffer_bytes(16, n, 16, 4) for r, n in enumerate(received)}
    assert combine == {r: combine_buffer_bytes(n, 16, 16, 4) for r, n in enumerate(received)}
