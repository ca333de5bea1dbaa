"""Under msrun (2 CPU workers): the MindSpore transport (direct collectives and aggregated
packets through mint.distributed) and the shared-memory AllToAll / ReduceScatter that
MindSpore's CPU backend lacks; the ranks share the job token by the msrun rendezvous (no
MSHYPER_JOB_TOKEN in msrun's environment). One test: the cluster set-up costs ~6 s."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

WORKER = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import mindspore as ms
    from mindspore.communication import init
    ms.set_device("CPU")
    init()
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        sys.exit(0)
    from mindspore_hyper.comm import MindSporeCommunicator, ShmCommunicator
    out_dir = sys.argv[1]
    g = MindSporeCommunicator(aggregation_bytes=4096)  # packets are sent on flush, on this thread
    r, p = g.rank, g.size
    res = {"rank": r, "size": p}

    class InCell(ms.nn.Cell):
        """The first collectives run inside a Cell of mixed-precision type BF16 (a tensor-parallel
        forward under to_float): MindSpore casts a kernel's float32 inputs to bfloat16 there.
        A communicator of its own: g's aggregator counters stay those checked below."""
        def construct(self, x):
            c = MindSporeCommunicator()
            res["cell_all_reduce"] = c.all_reduce(np.full(3, 1.0 + 2 ** -12 * (r + 1), np.float32)).tolist()
            res["cell_all_gather"] = c.all_gather(np.full(2, r + 2 ** -12, np.float32)).tolist()
            res["cell_broadcast"] = c.broadcast(np.full(2, r + 2 ** -12, np.float32), root=1).tolist()
            res["cell_async"] = c.all_reduce_async(np.full(2, r + 2 ** -12, np.float32)).wait().tolist()
            c.close()
            return x

    InCell().to_float(ms.bfloat16)(ms.Tensor(np.zeros(1, np.float32)))
    backwards = MindSporeCommunicator(ranks=[1, 0])  # members not in global order: gathered in member order
    res["reversed_rank"] = backwards.rank
    res["reversed_all_gather"] = backwards.all_gather(np.full(1, r, np.float32)).tolist()
    backwards.close()
    res["all_reduce"] = g.all_reduce(np.arange(10, dtype=np.float32) + r).tolist()
    res["all_reduce_max_i32"] = g.all_reduce(np.array([r, -r, 5], np.int32), "max").tolist()
    res["all_gather"] = g.all_gather(np.full((2,), r, np.float32)).tolist()
    res["broadcast"] = g.broadcast(np.full(3, r, np.float32), root=1).tolist()
    # aggregated: mixed sizes, two dtypes, one request above the 4KB packet (bypass)
    sizes = [1, 100, 1000, 5, 3000]
    hs = [g.all_reduce_async(np.arange(n, dtype=np.float32) * (r + 1) + i) for i, n in enumerate(sizes)]
    hi = g.all_reduce_async(np.full(7, r + 2, np.int32), "min")
    g.flush()
    res["agg"] = [h.wait().tolist() for h in hs]
    res["agg_i32_min"] = hi.wait().tolist()
    res["stats"] = g.aggregator_stats()
    res["ms_packets"] = g.packets_sent
    # the batched submit (one storage block: reduced in place), and averages in place
    hm = g.all_reduce_async_many([np.full(5, r + 1, np.float32), np.arange(3, dtype=np.int32) * (r + 1)], "avg")
    g.flush()
    res["many_avg"] = [y.tolist() for y in hm.wait()]
    res["avg_i64"] = g.all_reduce(np.array([r, 3 * r + 1], np.int64), "avg").tolist()
    # what MindSpore's CPU backend lacks, through the shared-memory transport
    x = np.arange(4 * 3, dtype=np.float32).reshape(4, 3) + 100 * r
    res["all_to_all"] = g.all_to_all(x, split_dim=0, concat_dim=0).tolist()
    res["reduce_scatter"] = g.reduce_scatter(x, dim=0, op="sum").tolist()
    res["all_to_all_v"] = [a.tolist() if hasattr(a, "tolist") else a
                           for a in g.shm().all_to_all_v(np.arange(3 + r, dtype=np.int32) + 10 * r, [1, 2 + r])]
    res["shm_segment"] = g.shm().segment_name
    res["token"] = os.environ.get("MSHYPER_JOB_TOKEN")  # from the rendezvous: msrun's environment has none
    params = g.calibrate(repeats=3, large_bytes=1 << 16)
    res["calib"] = [params.alpha_s, params.beta_s_per_byte]
    g.close()
    try:
        g.all_reduce(np.ones(2, np.float32))
        res["after_close"] = "no error"
    except Exception as exc:
        res["after_close"] = type(exc).__name__ + ": " + str(exc)
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(res, f)
''')


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.msrun
def test_mindspore_transport_and_shm_alltoall_under_msrun(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k != "MSHYPER_JOB_TOKEN"}  # the ranks meet by the rendezvous
    (tmp_path / "run").mkdir(mode=0o700)
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "run")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    cmd = [os.path.join(os.path.dirname(sys.executable), "msrun"), "--worker_num=2", "--local_worker_num=2",
           f"--master_port={_free_port()}", f"--log_dir={tmp_path / 'logs'}", "--join=True", str(script),
           str(tmp_path)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("msrun did not finish within 240 s (hang)")
    logs = ""
    for name in ("worker_0.log", "worker_1.log"):
        path = tmp_path / "logs" / name
        if path.exists():
            logs += "\n".join(l for l in path.read_text().splitlines() if not l.startswith("[")) [-3000:]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    x = [np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * r for r in range(2)]
    for r, out in enumerate(res):
        assert out["size"] == 2 and out["rank"] == r
        # in the BF16 Cell: exact float32 sums of values bfloat16 cannot hold (2**-12 is below its
        # 8-bit significand at 1.0), so a reduction of a bfloat16 copy, or this rank's own input
        # left unreduced (what MindSpore did before `_uncast`), fails the equality
        assert out["cell_all_reduce"] == [np.float32(1 + 2 ** -12 * 1) + np.float32(1 + 2 ** -12 * 2)] * 3
        assert out["cell_all_gather"] == [2 ** -12] * 2 + [1 + 2 ** -12] * 2
        assert out["cell_broadcast"] == [1 + 2 ** -12] * 2
        assert out["cell_async"] == [np.float32(2 ** -12) + np.float32(1 + 2 ** -12)] * 2
        assert out["reversed_rank"] == 1 - r and out["reversed_all_gather"] == [1, 0]
        assert out["all_reduce"] == (2 * np.arange(10) + 1).tolist()
        assert out["all_reduce_max_i32"] == [1, 0, 5]
        assert out["all_gather"] == [0, 0, 1, 1]
        assert out["broadcast"] == [1, 1, 1]
        for i, (n, got) in enumerate(zip([1, 100, 1000, 5, 3000], out["agg"])):
            np.testing.assert_allclose(got, np.arange(n) * 3 + 2 * i)
        assert out["agg_i32_min"] == [2] * 7
        assert out["many_avg"] == [[1.5] * 5, [0, 1, 3]]  # int avg truncates: (0+0)/2, (1+2)/2, (2+4)/2
        assert out["avg_i64"] == [0, 2]  # (0+1)/2 -> 0, (1+4)/2 -> 2
        assert out["after_close"].startswith("CommError: MindSporeCommunicator(rank") and "is closed" in out["after_close"]
        stats = out["stats"]
        assert stats["requests"] == 6 and stats["bypassed"] == 1  # 12000 B > 4096 B
        # one batch at flush(): float32/sum in order 1, 100 | 1000, 5 (4096 B packets; 3000 floats
        # bypass), int32/min: 3 packets
        assert stats["packets"] == 3 and stats["batches"] == 1
        assert stats["bytes"] == 4 * (1 + 100 + 1000 + 5 + 3000) + 4 * 7
        # MindSpore carried the packets, the bypassed request and the batch's queue comparison
        assert out["ms_packets"] == stats["packets"] + stats["bypassed"] + stats["batches"]
        np.testing.assert_array_equal(out["all_to_all"], np.concatenate([np.array_split(x[q], 2)[r] for q in range(2)]))
        np.testing.assert_array_equal(out["reduce_scatter"], np.array_split(x[0] + x[1], 2)[r])
        sent = [np.arange(3 + q, dtype=np.int32) + 10 * q for q in range(2)]
        counts = [[1, 2 + q] for q in range(2)]
        expect = np.concatenate([sent[q][sum(counts[q][:r]):sum(counts[q][:r + 1])] for q in range(2)])
        assert out["all_to_all_v"][0] == expect.tolist()
        assert out["all_to_all_v"][1] == [counts[q][r] for q in range(2)]
        assert out["calib"][0] > 0 and out["calib"][1] > 0
    assert res[0]["calib"] == res[1]["calib"]  # the maximum over ranks
    assert res[0]["token"] == res[1]["token"] != os.environ["MSHYPER_JOB_TOKEN"] and len(res[0]["token"]) == 32
    assert list((tmp_path / "run" / "mindspore_hyper").iterdir()) == []  # rank 0 removed its rendezvous file
    seg = res[0]["shm_segment"].lstrip("/")
    assert not os.path.exists(os.path.join("/dev/shm", seg))
