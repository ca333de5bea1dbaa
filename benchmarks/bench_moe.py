"""MoE benchmarks: load balance by hot-expert replication, 1-bit routing metadata, overlapped
expert-parallel dispatch.

1. balance  Zipf-skewed top-8 routing of --tokens tokens over 128 experts in 16 groups on 16
            devices (2 nodes). Tokens per device, max/mean: experts placed in order (8 per
            device) vs `rebalance_experts` placements with more physical slots. The placement
            is computed from one batch's counts and also evaluated on the next batch (EPLB
            works from history). Goal: max/mean <= 1.1.
2. metadata Bytes a device sends to describe its routing for --tokens tokens, top-8, 128
            experts: int32 expert index + float32 gate per token copy, a float32 T x E routing
            matrix, the 1-bit mask (C++ `pack_routing`); pack+unpack time vs numpy packbits.
3. links    Dispatch (and combine inter-group) bytes per link level measured from executed
            exchanges (an MoE layer on 16 simulated devices, node8: 2 nodes of 8 = 2 expert
            groups), unlimited vs group-limited routing (4 of 16 groups), flat vs hierarchical.
4. cache    Hot-expert cache (`offload/expert_cache.py`): 128 experts in the offload store, the device
            tier for 32; cold fetches per step and step time, routing-statistics priorities vs
            plain LRU, over a Zipf routing trace (first fifth of the steps excluded as warm-up).
   cache-train  The same in training (`hyper_offload` of a model with an MoE layer,
            offload/expert_offload.py): --cache-experts experts (H=64, F=128) of which the
            device tier holds --cache-capacity, a router skewed Zipf-like (a constant input
            feature adds 0.7 log(1/rank) to the logits), --cache-tokens tokens top-2 per step,
            Adam. Cold fetches per step and step time, routing vs LRU, and the step time of
            the same model not offloaded (baseline, same run).
5. overlap  (msrun, 2 processes, shared-memory transport) the forward of an expert-parallel
            MoE layer, --overlap-tokens tokens per device, H=--overlap-hidden: whole (no
            overlap) vs the --overlap-variants ("<chunks>": AllToAlls on a background
            thread; "-inline": exchanged in line; "-nice": the thread at nice 19; "-sep":
            the row counts in their own exchange, as before `counts_with_rows`). Reports per
            step and process: step time and its ratio to the whole layer (same run), AllToAll
            seconds, the exposed part, the overlap ratio hidden / total communication from
            per-exchange timestamps (moe/overlap_stats.py), the layer thread's phase profile,
            and the largest difference of the output from the whole layer's.

Usage: .venv/bin/python benchmarks/bench_moe.py [--section all|balance|metadata|links|cache|cache-train|overlap]
Timings on a shared 2-core machine are noisy: compare ratios within one run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def zipf_routing(rng, tokens: int, experts: int, top_k: int, s: float, perm: np.ndarray, groups: int = 1,
                 topk_groups: int = 1) -> np.ndarray:
    """[tokens, top_k] distinct experts per token, expert popularity ~ 1/rank^s (ranks shuffled by
    perm); with `groups` > 1, limited to each token's best `topk_groups` groups (as the router)."""
    from mindspore_hyper.moe.router import limit_groups

    p = 1.0 / np.arange(1, experts + 1) ** s
    p = p[np.argsort(perm)] / p.sum()
    # Gumbel top-k: k distinct experts drawn without replacement with probabilities p
    keys = np.log(p)[None, :] - np.log(-np.log(rng.random((tokens, experts))))
    if groups > 1:
        keys = limit_groups(keys, groups, topk_groups)
    return np.argsort(-keys, axis=1)[:, :top_k]


def balance(tokens: int, zipf_s: float) -> dict:
    from mindspore_hyper.moe.eplb import rebalance_experts
    from mindspore_hyper.moe.expert_placement import ExpertPlacement, member_loads

    experts, groups, nodes, gpus, top_k = 128, 16, 2, 16, 8
    rng = np.random.default_rng(0)
    perm = rng.permutation(experts)
    history = np.bincount(zipf_routing(rng, tokens, experts, top_k, zipf_s, perm).ravel(), minlength=experts)
    fresh = np.bincount(zipf_routing(rng, tokens, experts, top_k, zipf_s, perm).ravel(), minlength=experts)
    ratio = lambda loads: float(loads.max() / loads.mean())
    identity = ExpertPlacement(np.arange(experts), experts)
    out = {"tokens": tokens, "zipf_s": zipf_s, "hottest_expert_share": float(history.max() / history.sum()),
           "in_order": ratio(member_loads(history, identity, gpus)), "replicated": {}}
    for slots in (144, 160, 192, 256):
        t0 = time.perf_counter()
        phy2log, _, _ = rebalance_experts(history[None, :], slots, groups, nodes, gpus)
        seconds = time.perf_counter() - t0
        placement = ExpertPlacement.from_eplb(phy2log)
        out["replicated"][slots] = {"same_batch": ratio(member_loads(history, placement, gpus)),
                                    "next_batch": ratio(member_loads(fresh, placement, gpus)),
                                    "rebalance_seconds": seconds}
    return out


def metadata(tokens: int) -> dict:
    from mindspore_hyper.moe.routing_bits import pack_routing, unpack_routing

    experts, top_k = 128, 8
    rng = np.random.default_rng(1)
    chosen = zipf_routing(rng, tokens, experts, top_k, 1.0, rng.permutation(experts))
    mask = np.zeros((tokens, experts), bool)
    mask[np.arange(tokens)[:, None], chosen] = True
    packed = pack_routing(mask)
    assert np.array_equal(unpack_routing(packed, tokens, experts), mask)

    def best(fn, n=20):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    return {"tokens": tokens, "experts": experts, "top_k": top_k,
            "index_gate_bytes": tokens * top_k * (4 + 4), "float_matrix_bytes": tokens * experts * 4,
            "one_bit_bytes": int(packed.size),
            "pack_unpack_seconds": best(lambda: unpack_routing(pack_routing(mask), tokens, experts)),
            "numpy_packbits_seconds": best(lambda: np.unpackbits(np.packbits(mask.ravel(), bitorder="little"),
                                                                 bitorder="little")[:tokens * experts])}


def links(tokens: int, experts: int, hidden: int) -> dict:
    """Dispatch bytes per link level measured from executed exchanges: one expert-parallel MoE
    layer forward on 16 simulated devices of the node8 topology (2 nodes of 8 = 2 expert
    groups), `experts` experts, top-8, unlimited or group-limited routing (4 of 16 groups),
    dispatched flat or hierarchical (`MoE(dispatch=...)`); float32 rows of `hidden`."""
    import mindspore as ms
    from mindspore import Tensor, nn

    import mindspore_hyper as mh
    from mindspore_hyper import Layout
    from mindspore_hyper.moe import MoE
    from mindspore_hyper.runtime.simulation import simulate

    class Routed(nn.Cell):
        def __init__(self, moe):
            super().__init__()
            self.moe = moe

        def construct(self, x):
            return self.moe(x)[0]

    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(device_num=16, topology="node8")
    x = Tensor(np.random.default_rng(2).normal(size=(tokens, hidden)).astype(np.float32))
    strategy = Layout((16,), ("expert",))(tensor_map=()).override("*.experts.*", "expert")
    out = {}
    for name, groups in (("unlimited", {}), ("4 of 16 groups", {"num_groups": 16, "topk_groups": 4})):
        results = {}
        for dispatch in ("flat", "hierarchical"):
            ms.set_seed(0)
            moe = MoE(hidden, hidden, experts, top_k=8, dispatch=dispatch, **groups)
            start = time.perf_counter()
            results[dispatch] = simulate(Routed(moe), strategy)(x).asnumpy()
            stats = moe.parallel().last_stats
            out[f"{name}, {dispatch}"] = dict(stats["dispatch_link_bytes"], seconds=time.perf_counter() - start,
                                              combine_inter_group=stats["combine_link_bytes"]["inter_group"])
        assert np.allclose(results["flat"], results["hierarchical"], rtol=1e-5, atol=1e-6)
    return out


def cache(steps: int) -> dict:
    """Hot-expert cache: 128 experts of 3 x 256 x 512 float32 (1.5 MiB) in the offload store,
    device tier for 32; each step brings in the experts of 64 tokens' top-8 Zipf routing."""
    from mindspore_hyper.offload.expert_cache import HotExpertCache

    experts = 128
    rng = np.random.default_rng(3)
    perm = rng.permutation(experts)
    trace = [zipf_routing(rng, 64, experts, 8, 1.0, perm).ravel() for _ in range(steps)]
    weights = [np.full(3 * 256 * 512, e, np.float32) for e in range(experts)]
    out = {}
    for policy in ("lru", "routing"):
        c = HotExpertCache(weights, 32, policy)
        rows = []
        for used in trace:
            rows.append(c.step(used))
            c.observe(np.bincount(used, minlength=experts))
        c.close()
        warm = rows[steps // 5:]
        out[policy] = {"cold_per_step": float(np.mean([r["cold_fetches"] for r in warm])),
                       "experts_per_step": float(np.mean([len(set(u.tolist())) for u in trace[steps // 5:]])),
                       "step_seconds": float(np.median([r["seconds"] for r in warm]))}
    return out


def cache_train(steps: int, experts: int, capacity: int, tokens: int) -> dict:
    """Training with the experts in the hot-expert cache, routing priorities vs LRU, and the
    same model not offloaded (see the module docstring)."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from mindspore_hyper.moe import MoE
    from mindspore_hyper.offload.expert_cache import ExpertCacheConfig
    from mindspore_hyper.offload import OffloadPolicy, hyper_offload

    hidden = 64

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.moe = MoE(hidden, 128, num_experts=experts, top_k=2, aux_loss_coef=0.0)
            self.out = nn.Dense(hidden, hidden)

        def construct(self, x, t):
            y, aux = self.moe(x)
            return ((self.out(y) - t) ** 2).mean() + aux

    rng = np.random.default_rng(5)
    popularity = np.log(1.0 / np.arange(1, experts + 1))[rng.permutation(experts)]
    router = rng.normal(0.0, 1.0 / np.sqrt(hidden), (hidden, experts)).astype(np.float32)
    router[0] = 0.7 * popularity  # x[:, 0] = 1: logits = 0.7 log(1/rank) + noise of std ~1
    data = []
    for _ in range(steps + 1):
        x = rng.normal(size=(tokens, hidden)).astype(np.float32)
        x[:, 0] = 1.0
        data.append((Tensor(x), Tensor(rng.normal(size=(tokens, hidden)).astype(np.float32))))

    def model():
        ms.set_seed(0)
        net = Net()
        net.moe.router.weight.set_data(Tensor(router))
        return net

    adam = lambda ps: nn.Adam(ps, learning_rate=1e-3)  # noqa: E731
    out = {}
    net = model()
    opt = adam(net.trainable_params())
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    times = []
    for x, t in data:
        t0 = time.perf_counter()
        _, grads = grad_fn(x, t)
        opt(grads)
        float(_.asnumpy())
        times.append(time.perf_counter() - t0)
    out["not offloaded"] = {"step_seconds": float(np.median(times[1:]))}
    for policy in ("lru", "routing"):
        net = model()
        off = hyper_offload(net, OffloadPolicy(cells=["out"], expert_cache=ExpertCacheConfig(policy, capacity)),
                            optimizer=adam, block_size=1 << 20, device_memory=4 << 20, host_memory=64 << 20)
        try:
            step = off.train_step(net)
            times = []
            for x, t in data:
                t0 = time.perf_counter()
                float(step(x, t).asnumpy())
                times.append(time.perf_counter() - t0)
            s = off.stats()["expert_cache"][0]
        finally:
            off.close()
        warm = steps // 5 + 1
        out[policy] = {"cold_per_step": float(np.mean(s["cold_per_step"][warm:])),
                       "step_seconds": float(np.median(times[1:]))}
        out["experts_per_step"] = s["fetches"] / len(data)
    return out


def overlap_worker(out_dir: str, tokens: int, steps: int, hidden: int, variants: list) -> None:
    """Runs under msrun: forward of one expert-parallel MoE layer, whole vs chunked variants
    ("<chunks>", "<chunks>-inline": exchanged in line, "<chunks>-nice": background thread at
    nice 19, "<chunks>-sep": row counts in their own exchange before the rows), interleaved, twice; per variant the median step, the overlap report summed over
    the timed steps (moe/overlap_stats.py) and the phase profile, and the largest difference of
    its output from the whole layer's."""
    import mindspore as ms
    from mindspore import Tensor, nn

    import mindspore_hyper as mh
    from mindspore_hyper import Layout, auto_parallelize
    from mindspore_hyper.moe import MoE

    class Layer(nn.Cell):
        def __init__(self, chunks):
            super().__init__()
            self.moe = MoE(hidden, 2 * hidden, num_experts=8, top_k=2, overlap_chunks=chunks)

        def construct(self, x):
            return self.moe(x)[0]

    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(mode="distributed")
    world = int(os.environ["MS_WORKER_NUM"])
    x = Tensor(np.random.default_rng(0).normal(size=(world * tokens, hidden)).astype(np.float32))
    result, whole = {}, None
    for variant in ["1", *variants, "1", *variants]:  # interleaved, twice
        chunks = int(variant.split("-")[0])
        ms.set_seed(0)
        layer = Layer(chunks)
        engine = layer.moe.parallel()
        engine.background = not variant.endswith("-inline")
        engine.worker_nice = 19 if variant.endswith("-nice") else None
        engine.counts_with_rows = not variant.endswith("-sep")
        par = auto_parallelize(layer, Layout((world,), ("expert",))(tensor_map=()).override("*.experts.*", "expert"))
        y = par(x).asnumpy()  # warm-up
        if variant == "1":
            whole = y
        entry = result.setdefault(variant, {"step_seconds": [], "max_abs_diff": 0.0, "phase_seconds": {}})
        entry["max_abs_diff"] = max(entry["max_abs_diff"], float(np.abs(y - whole).max()))
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            par(x).asnumpy()
            times.append(time.perf_counter() - t0)
            stats = engine.last_stats
            for k in ("comm_seconds", "wait_seconds", "exposed_seconds", "hidden_seconds", "queue_seconds",
                      "metadata_seconds"):
                entry[k] = entry.get(k, 0.0) + stats.get(k, 0.0)
            for k, v in stats.get("phase_seconds", {}).items():
                entry["phase_seconds"][k] = entry["phase_seconds"].get(k, 0.0) + v
        entry["step_seconds"].append(statistics.median(times))
        entry["timed_steps"] = entry.get("timed_steps", 0) + steps
    rank = int(os.environ.get("RANK_ID", "0"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def overlap(tokens: int, steps: int, hidden: int, variants: list) -> dict:
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""), PYTHONPATH=ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [os.path.join(bindir, "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={port}",
               f"--log_dir={tmp}/logs", "--join=True", os.path.abspath(__file__), "--run-worker", tmp,
               "--overlap-tokens", str(tokens), "--steps", str(steps), "--overlap-hidden", str(hidden),
               "--overlap-variants", ",".join(variants)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode:
            logdir = os.path.join(tmp, "logs")
            logs = "".join(open(os.path.join(logdir, f)).read()[-2000:] for f in os.listdir(logdir)) \
                if os.path.isdir(logdir) else ""
            raise RuntimeError(f"msrun failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}{logs}")
        ranks = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(2)]
    out = {"tokens_per_device": tokens, "hidden": hidden, "variants": {}}
    for variant in ["1", *variants]:
        rs = [r[variant] for r in ranks]
        v = {"step_seconds": max(min(r["step_seconds"]) for r in rs),
             "max_abs_diff": max(r["max_abs_diff"] for r in rs)}
        for k in ("comm_seconds", "wait_seconds", "exposed_seconds", "hidden_seconds", "queue_seconds",
                  "metadata_seconds"):
            v[k] = sum(r.get(k, 0.0) for r in rs) / len(rs) / rs[0]["timed_steps"]  # per step and process
        v["phases"] = {k: sum(r["phase_seconds"].get(k, 0.0) for r in rs) / len(rs) / rs[0]["timed_steps"]
                       for k in rs[0]["phase_seconds"]}
        if variant == "1" or variant.endswith("-inline"):  # exchanged in line: all of it exposed
            v["exposed_seconds"], v["hidden_seconds"], v["queue_seconds"] = v["comm_seconds"], 0.0, 0.0
        v["overlap_ratio"] = v["hidden_seconds"] / v["comm_seconds"] if v["comm_seconds"] > 0 else 0.0
        out["variants"][variant] = v
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", default="all", choices=["all", "balance", "metadata", "links", "cache", "cache-train",
                                                               "overlap"])
    parser.add_argument("--cache-steps", type=int, default=40, help="steps of the cache section")
    parser.add_argument("--cache-train-steps", type=int, default=20, help="steps of the cache-train section")
    parser.add_argument("--cache-experts", type=int, default=32, help="experts, cache-train section")
    parser.add_argument("--cache-capacity", type=int, default=12, help="experts on the device tier, cache-train")
    parser.add_argument("--cache-tokens", type=int, default=6, help="tokens per step, cache-train (top-2: at most "
                        "2x this many experts a step, which must fit the capacity)")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens of the balance and metadata sections")
    parser.add_argument("--links-tokens", type=int, default=256, help="tokens of the links section")
    parser.add_argument("--links-experts", type=int, default=32, help="experts of the links section")
    parser.add_argument("--links-hidden", type=int, default=64, help="hidden size of the links section")
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of expert popularity")
    parser.add_argument("--overlap-tokens", type=int, default=2048, help="tokens per device, overlap section")
    parser.add_argument("--steps", type=int, default=3, help="timed forwards per variant, overlap section")
    parser.add_argument("--overlap-hidden", type=int, default=256, help="H of the overlap section (F = 2H)")
    parser.add_argument("--overlap-variants", default="2,4,4-inline,4-nice",
                        help="chunked variants of the overlap section: <chunks>[-inline|-nice|-sep], comma-separated")
    parser.add_argument("--run-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_worker is not None:
        if os.environ.get("MS_ROLE") == "MS_SCHED":
            return
        overlap_worker(args.run_worker, args.overlap_tokens, args.steps, args.overlap_hidden,
                       args.overlap_variants.split(","))
        return
    if args.section in ("all", "balance"):
        r = balance(args.tokens, args.zipf)
        print(f"balance: {r['tokens']} tokens, top-8 of 128 experts (16 groups), 16 devices on 2 nodes, Zipf s={r['zipf_s']} "
              f"(hottest expert {r['hottest_expert_share']:.1%} of copies)")
        print(f"  experts in order, 8 per device: max/mean tokens per device = {r['in_order']:.3f}")
        for slots, v in r["replicated"].items():
            print(f"  rebalance_experts, {slots} slots: max/mean = {v['same_batch']:.3f} (placement's batch), "
                  f"{v['next_batch']:.3f} (next batch)   [{v['rebalance_seconds'] * 1e3:.1f} ms]")
    if args.section in ("all", "metadata"):
        r = metadata(args.tokens)
        print(f"metadata per device for {r['tokens']} tokens, top-{r['top_k']} of {r['experts']} experts:")
        print(f"  int32 index + float32 gate per copy: {r['index_gate_bytes']:>9} B")
        print(f"  float32 T x E routing matrix:        {r['float_matrix_bytes']:>9} B")
        print(f"  1-bit mask:                          {r['one_bit_bytes']:>9} B "
              f"({r['index_gate_bytes'] / r['one_bit_bytes']:.1f}x less than index+gate, "
              f"{r['float_matrix_bytes'] / r['one_bit_bytes']:.0f}x less than the float matrix)")
        print(f"  pack+unpack (C++): {r['pack_unpack_seconds'] * 1e6:.0f} us; numpy packbits+unpackbits: "
              f"{r['numpy_packbits_seconds'] * 1e6:.0f} us")
    if args.section in ("all", "links"):
        print(f"dispatch bytes per link level, executed (simulation): {args.links_tokens} tokens over 16 devices "
              f"(node8: 2 nodes x 8 = 2 expert groups), top-8 of {args.links_experts}, float32 rows of "
              f"{args.links_hidden}:")
        r = links(args.links_tokens, args.links_experts, args.links_hidden)
        for name, v in r.items():
            print(f"  {name:<30} local {v['local'] / 2**10:8.1f} KiB  intra-group {v['intra_group'] / 2**10:8.1f} KiB  "
                  f"inter-group {v['inter_group'] / 2**10:8.1f} KiB  (combine inter-group "
                  f"{v['combine_inter_group'] / 2**10:.1f} KiB, {v['seconds']:.1f} s)")
        for name in ("unlimited", "4 of 16 groups"):
            flat, hier = r[f"{name}, flat"], r[f"{name}, hierarchical"]
            print(f"  {name}: inter-group dispatch bytes hierarchical / flat = "
                  f"{hier['inter_group'] / flat['inter_group']:.3f}, combine "
                  f"{hier['combine_inter_group'] / flat['combine_inter_group']:.3f}")
    if args.section in ("all", "cache"):
        r = cache(args.cache_steps)
        print("hot-expert cache: 128 experts (1.5 MiB each) in the offload store, device tier for 32, "
              f"{r['lru']['experts_per_step']:.0f} distinct experts per step (64 tokens, top-8, Zipf):")
        for policy, v in r.items():
            print(f"  {policy:<8} cold fetches per step {v['cold_per_step']:5.1f}   step {v['step_seconds'] * 1e3:6.1f} ms")
    if args.section in ("all", "cache-train"):
        r = cache_train(args.cache_train_steps, args.cache_experts, args.cache_capacity, args.cache_tokens)
        print(f"hot-expert cache in training (hyper_offload): {args.cache_experts} experts (H=64, F=128), device tier for "
              f"{args.cache_capacity}, {args.cache_tokens} tokens top-2 per step ({r['experts_per_step']:.1f} experts "
              "per step), Zipf-skewed router, Adam:")
        base = r["not offloaded"]["step_seconds"]
        print(f"  not offloaded       step {base * 1e3:7.1f} ms")
        for policy in ("lru", "routing"):
            v = r[policy]
            print(f"  {policy:<8} cold fetches per step {v['cold_per_step']:5.2f}   step {v['step_seconds'] * 1e3:7.1f} ms "
                  f"({v['step_seconds'] / base:.2f}x not offloaded)")
    if args.section in ("all", "overlap"):
        r = overlap(args.overlap_tokens, args.steps, args.overlap_hidden, args.overlap_variants.split(","))
        print(f"overlap (msrun, 2 processes, {r['tokens_per_device']} tokens per device, H={r['hidden']}, "
              f"F={2 * r['hidden']}, 8 experts, top-2); per step and process:")
        base = r["variants"]["1"]["step_seconds"]
        for name, v in r["variants"].items():
            label = "whole" if name == "1" else name
            phases = ", ".join(f"{k} {t * 1e3:.0f}" for k, t in v["phases"].items())
            print(f"  {label:<9} step {v['step_seconds'] * 1e3:7.1f} ms ({v['step_seconds'] / base:.2f}x whole)  "
                  f"AllToAll {v['comm_seconds'] * 1e3:6.1f} ms (counts {v['metadata_seconds'] * 1e3:5.1f}), exposed {v['exposed_seconds'] * 1e3:6.1f} ms, "
                  f"queued {v['queue_seconds'] * 1e3:5.1f} ms -> overlap ratio {v['overlap_ratio']:.2f}"
                  f"{'  [ms: ' + phases + ']' if phases else ''}  max |y - whole| {v['max_abs_diff']:.1e}")


if __name__ == "__main__":
    main()
