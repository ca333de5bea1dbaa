"""In-process transport (all ranks in one process): every collective against numpy, algorithm
choice, hierarchy on node8, aggregation and mismatch errors."""
import numpy as np
import pytest

from mindspore_hyper.comm import CommMismatch, InProcessCommunicator

DTYPES = [np.float32, np.float16, np.int32]


def _inputs(p, n, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return [rng.integers(-50, 50, n).astype(dtype) for _ in range(p)]
    return [(rng.standard_normal(n) * 3).astype(dtype) for _ in range(p)]


def _ref(xs, op):
    st = np.stack([x.astype(np.float64) for x in xs])
    if op == "avg" and xs[0].dtype.kind == "i":
        return np.trunc(st.sum(0) / len(xs))
    return {"sum": st.sum(0), "max": st.max(0), "min": st.min(0), "avg": st.mean(0)}[op]


def _assert_close(y, ref, dtype):
    assert y.dtype == dtype
    if np.dtype(dtype).kind == "i":
        np.testing.assert_array_equal(y, ref)
    elif dtype == np.float16:
        np.testing.assert_allclose(y.astype(np.float64), ref, rtol=1e-2, atol=0.05)
    else:
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("p", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_every_algorithm_and_op(p, dtype):
    g = InProcessCommunicator(p, topology=False, channel_bytes=4096)
    for n in (1, 7, 1001, 40001):
        xs = _inputs(p, n, dtype, n)
        for algo in ("ring", "ring_direct", "recursive_doubling"):
            for op in ("sum", "max", "min", "avg"):
                ys = g.all_reduce(xs, op, algo)
                assert g.last_algorithm == algo
                for y in ys:
                    _assert_close(y, _ref(xs, op), dtype)
                # every rank holds bit-identical results
                assert all(np.array_equal(ys[0], y) for y in ys)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_scatter_alltoall_broadcast(dtype):
    p = 3
    g = InProcessCommunicator(p, topology=False, channel_bytes=4096)
    for n in (1, 5, 2001):
        xs = [x.reshape(1, n) for x in _inputs(p, n, dtype, n)]
        # all_gather along dim 1 with uneven sizes
        parts = [np.concatenate([x] * (r + 1), axis=1) for r, x in enumerate(xs)]
        for y in g.all_gather(parts, dim=1):
            np.testing.assert_array_equal(y, np.concatenate(parts, axis=1))
        mats = [np.tile(x, (4, 1)) + np.arange(4, dtype=dtype)[:, None] for x in xs]
        for dim in (0, 1):
            out = g.reduce_scatter(mats, dim=dim, op="sum")
            ref = np.array_split(np.stack([m.astype(np.float64) for m in mats]).sum(0), p, axis=dim)
            for r in range(p):
                assert out[r].shape == ref[r].shape
                _assert_close(out[r], ref[r], dtype)
        outs = g.all_to_all(mats, split_dim=1, concat_dim=0)
        for j in range(p):
            np.testing.assert_array_equal(
                outs[j], np.concatenate([np.array_split(m, p, axis=1)[j] for m in mats], axis=0))
        for algo in ("binomial", "pipelined_chain"):
            for root in range(p):
                for y in g.broadcast(xs, root=root, algorithm=algo):
                    np.testing.assert_array_equal(y, xs[root])


def test_all_to_all_v_uneven_and_empty():
    p = 4
    g = InProcessCommunicator(p, topology=False)
    counts = [[(r * j) % 3 for j in range(p)] for r in range(p)]
    counts[2] = [0, 0, 0, 0]  # a rank that sends nothing
    data = [np.arange(sum(c), dtype=np.float32) + 100 * r for r, c in enumerate(counts)]
    res = g.all_to_all_v(data, counts)
    for j in range(p):
        recv, rc = res[j]
        expect = []
        for r in range(p):
            off = sum(counts[r][:j])
            expect.append(data[r][off:off + counts[r][j]])
        np.testing.assert_array_equal(recv, np.concatenate(expect))
        assert rc == [counts[r][j] for r in range(p)]


def test_send_recv_and_barrier():
    g = InProcessCommunicator(4, topology=False)
    x = np.arange(11, dtype=np.int32)
    np.testing.assert_array_equal(g.send_recv(x, src=3, dst=1), x)
    g.barrier()


def test_hierarchical_on_node8_and_routing():
    g = InProcessCommunicator(16, topology="node8")
    assert sorted(g.ring) == list(range(16))
    xs = _inputs(16, 1 << 16, np.float32, 1)
    ys = g.all_reduce(xs)  # 256KB across two nodes: the model picks the two-level algorithm
    assert g.last_algorithm == "hierarchical"
    for y in ys:
        _assert_close(y, _ref(xs, "sum"), np.float32)
    # one node only: uniform links, no hierarchy
    g8 = InProcessCommunicator(8, topology="node8")
    g8.all_reduce(_inputs(8, 1 << 16, np.float32, 2))
    assert g8.last_algorithm in ("ring", "recursive_doubling")


def test_hierarchical_with_unequal_clusters():
    # 3 devices of node 0 and 2 of node 1: leader-based two-level all-reduce
    g = InProcessCommunicator(5, topology="node8", devices=[0, 1, 2, 8, 9])
    xs = _inputs(5, 1001, np.int32, 3)
    for op in ("sum", "max", "avg"):
        ys = g.all_reduce(xs, op, algorithm="hierarchical")
        assert g.last_algorithm == "hierarchical"
        for y in ys:
            _assert_close(y, _ref(xs, op), np.int32)


def test_ring_topology_orders_ring_by_links():
    # ranks mapped to ring devices out of order: the ring follows the physical neighbours
    devices = [0, 4, 1, 5, 2, 6, 3, 7]
    g = InProcessCommunicator(8, topology="ring", devices=devices)
    order = [devices[r] for r in g.ring]
    assert order in ([0, 1, 2, 3, 4, 5, 6, 7], [0, 7, 6, 5, 4, 3, 2, 1])
    xs = _inputs(8, 333, np.float32, 4)
    for y in g.all_reduce(xs, algorithm="ring"):
        _assert_close(y, _ref(xs, "sum"), np.float32)


def test_threshold_and_force_override_choice():
    g = InProcessCommunicator(4, topology="supernode384")
    xs = _inputs(4, 64, np.float32, 5)
    g.all_reduce(xs)
    assert g.last_algorithm == "recursive_doubling"  # 256 bytes: latency-optimal
    g.set_threshold("all_reduce", 0)
    g.all_reduce(xs)
    assert g.last_algorithm == "ring"
    g.set_threshold("all_reduce", None)
    g.force_algorithm("all_reduce", "ring")
    g.all_reduce(xs)
    assert g.last_algorithm == "ring"
    g.force_algorithm("all_reduce", None)
    g.all_reduce(xs)
    assert g.last_algorithm == "recursive_doubling"


@pytest.mark.parametrize("cpp_check", [False, True])
def test_mismatch_names_both_ranks(cpp_check):
    g = InProcessCommunicator(3, topology=False)
    if cpp_check:  # the C++ descriptor all-gather, as between processes (Python check bypassed)
        g.set_validate(True)
        g._agree = lambda *a, **k: None
    xs = [np.ones(10, np.float32), np.ones(10, np.float32), np.ones(12, np.float32)]
    with pytest.raises(CommMismatch, match=r"rank 0 calls all_reduce\(float32, 10 elements, op sum\) but rank 2 "
                                           r"calls all_reduce\(float32, 12 elements, op sum\)"):
        g.all_reduce(xs)
    with pytest.raises(CommMismatch, match="int32"):
        g.all_reduce([np.ones(4, np.float32), np.ones(4, np.int32), np.ones(4, np.float32)])
    # the group still works
    for y in g.all_reduce([np.ones(4, np.float32)] * 3):
        np.testing.assert_array_equal(y, np.full(4, 3, np.float32))


def test_aggregation_unpacks_mixed_sizes_exactly():
    p = 3
    g = InProcessCommunicator(p, topology=False, aggregation_bytes=4096, max_delay=3600.0)  # packets only on flush
    specs = [(1, np.float32, "sum"), (999, np.float32, "sum"), (100, np.int32, "max"), (2000, np.float32, "sum"),
             (17, np.float16, "sum"), (3, np.int32, "sum"), (50, np.float32, "avg"), (5, np.float32, "sum")]
    handles, refs = [], []
    for i, (n, dtype, op) in enumerate(specs):
        xs = _inputs(p, n, dtype, 10 + i)
        handles.append(g.all_reduce_async(xs, op))
        refs.append((xs, op, dtype))
    g.flush()
    for h, (xs, op, dtype) in zip(handles, refs):
        ys = h.wait()
        assert len(ys) == p
        for y in ys:
            assert y.shape == xs[0].shape
            _assert_close(y, _ref(xs, op), dtype)
    stats = g.aggregator_stats()
    assert stats["requests"] == len(specs)
    assert stats["bypassed"] == 1  # 2000 float32 = 8000 bytes > 4096
    # one batch packs float32/sum 1+999+5 elems (4020 B), int32/max, float16/sum, int32/sum, float32/avg: 5
    # packets; a full queue may start a batch early and split one key's packet in two (at most 7)
    assert 5 <= stats["packets"] <= 7
    assert stats["bytes"] == sum(n * np.dtype(d).itemsize for n, d, _ in specs)


def test_aggregation_sends_after_bounded_delay_without_flush():
    g = InProcessCommunicator(2, topology=False, aggregation_bytes=1 << 20, max_delay=0.002)
    h = g.all_reduce_async([np.ones(3, np.float32), np.full(3, 2, np.float32)])
    ys = h.wait(timeout=10)  # no flush(): the packet leaves after max_delay
    for y in ys:
        np.testing.assert_array_equal(y, np.full(3, 3, np.float32))
    assert g.aggregator_stats()["packets"] == 1


def test_aggregation_full_packet_is_sent_without_flush():
    g = InProcessCommunicator(2, topology=False, aggregation_bytes=1024, max_delay=3600.0)
    hs = [g.all_reduce_async([np.full(64, i, np.float32)] * 2) for i in range(4)]  # 4 x 256 B = one full packet
    for i, h in enumerate(hs):
        for y in h.wait(timeout=30):
            np.testing.assert_array_equal(y, np.full(64, 2 * i, np.float32))


def test_calibrate_gives_positive_costs():
    g = InProcessCommunicator(2, topology=False)
    params = g.calibrate(repeats=5)
    assert params.alpha_s > 0 and params.beta_s_per_byte > 0 and params.gamma_s_per_byte > 0
    assert g.model(0).params.alpha_s == params.alpha_s == g.model(1).params.alpha_s


def test_aggregation_bytes_from_context_flag():
    from mindspore_hyper import reset_context, set_context

    set_context(comm_aggregation_bytes="8KiB")
    try:
        g = InProcessCommunicator(2, topology=False)
        assert g.aggregation_bytes == 8192
        hs = [g.all_reduce_async([np.full(1024, i, np.float32)] * 2) for i in range(5)]  # 5 x 4KB
        g.flush()
        for i, h in enumerate(hs):
            for y in h.wait():
                np.testing.assert_array_equal(y, np.full(1024, 2 * i, np.float32))
        stats = g.aggregator_stats()
        assert stats["bypassed"] == 0 and stats["packets"] >= 3  # at most two 4KB requests per 8KB packet
    finally:
        reset_context()


def test_aggregation_mismatch_fails_the_batch_on_every_rank():
    g = InProcessCommunicator(2, topology=False, max_delay=3600.0)
    h = g.all_reduce_async([np.ones(10, np.float32), np.ones(11, np.float32)])
    g.flush()
    with pytest.raises(CommMismatch, match="differ across ranks"):
        h.wait()
    # later batches are unaffected
    ok = g.all_reduce_async([np.ones(4, np.float32), np.full(4, 2, np.float32)])
    g.flush()
    for y in ok.wait():
        np.testing.assert_array_equal(y, np.full(4, 3, np.float32))


def test_float16_conversion_is_exact_for_max_min_and_rounds_like_numpy():
    bits = np.arange(0, 1 << 16, dtype=np.uint16)
    vals = bits.view(np.float16)
    vals = vals[~np.isnan(vals)]  # every finite/infinite half, subnormals included
    rng = np.random.default_rng(7)
    other = rng.permutation(vals)
    g = InProcessCommunicator(2, topology=False)
    for op, ref in (("max", np.maximum(vals, other)), ("min", np.minimum(vals, other))):
        for y in g.all_reduce([vals, other], op):
            np.testing.assert_array_equal(y.view(np.uint16), ref.view(np.uint16))
    # sums of two halves are rounded once (float32 sum of two halves is exact): numpy's result bit for bit
    a = rng.standard_normal(4097).astype(np.float16) * np.float16(1000)
    b = rng.standard_normal(4097).astype(np.float16) * np.float16(0.01)
    ref = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
    for y in g.all_reduce([a, b], "sum"):
        np.testing.assert_array_equal(y.view(np.uint16), ref.view(np.uint16))


def test_zero_dim_arrays_keep_their_shape():
    group = InProcessCommunicator(2)
    out = group.all_reduce([np.array(1.5, np.float32), np.array(2.0, np.float32)], "sum")
    assert out[0].shape == () and float(out[1]) == 3.5
    group.close()
