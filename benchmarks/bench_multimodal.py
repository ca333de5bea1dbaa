"""Multimodal serving: synchronous vs asynchronous encoder pipeline vs async + LSH feature cache,
on the Qwen-VL-shaped example model, encoder and LM in separate processes (msrun, distributed
mode), all three in one run on the same request stream; then the same three in simulation mode
(virtual groups; compute priced by a cost model calibrated in this run: the fastest of 3 timed
calls, the encoder in proportion to its patch count, so the figures show the schedule's effect
without the load's noise). Prints request latency (mean, p99), throughput and
the ratios against the synchronous run, the share of near-duplicates reused, and the false-reuse
count (must be 0); and the LSH recall of the cache against an exact scan of the same entries.

    python benchmarks/bench_multimodal.py                       # 12 batches of 4, 30% near-duplicates
    python benchmarks/bench_multimodal.py --batches 24 --duplicates 0.5 --ahead 2

Requests all arrive at t = 0 (an offline queue): a request's latency is the time until its
batch's LM output, throughput is requests / makespan. One warm-up pass per image resolution runs
before the timed runs. Timings are wall-clock on whatever the machine is doing: on a loaded
machine they are noisy, and overlap needs a free core per process.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--duplicates", type=float, default=0.3)
    p.add_argument("--variance", type=float, default=0.3)
    p.add_argument("--ahead", type=int, default=1)
    p.add_argument("--threshold", type=float, default=0.95)
    p.add_argument("--repeat", type=int, default=1, help="distributed runs of the three variants (medians)")
    p.add_argument("--no-simulation", action="store_true", help="only the distributed run")
    p.add_argument("--report-dir", help=argparse.SUPPRESS)  # msrun worker: output directory
    return p.parse_args()


def calibrated_costs(stream, encoder, lm, repeats: int = 3):
    """A cost model from this machine: the fastest of `repeats` timed encoder calls on a full batch
    at the stream's middle resolution and of LM calls (the least disturbed by other load); an
    encoder call is priced in proportion to its patches (the ViT's work: +-30% over the stream),
    both scaled by the rows really computed. Also returns the fastest time per resolution, which
    on this CPU-scale model is mostly per-op overhead and hardly follows the patch count."""
    import time

    import mindspore as ms

    def fastest(fn):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        return best

    measured = {}
    for b in stream.batches:
        side = b.images.shape[-1]
        if side not in measured:
            measured[side] = fastest(lambda: encoder(ms.Tensor(b.images)).asnumpy())
    sides = sorted(measured)
    base = sides[len(sides) // 2]
    batch = stream.batches[0]
    feats = encoder(ms.Tensor(batch.images))
    lm_time = fastest(lambda: lm(feats, ms.Tensor(batch.text)).asnumpy())

    def cost(kind, b, rows):
        if kind == "encode":
            return measured[base] * (b.images.shape[-1] / base) ** 2 * rows / b.size
        return lm_time * rows / b.size

    return cost, measured, lm_time


def measure(args, calibrate: bool = False) -> dict:
    """Runs the three variants in the current mode; the LM process returns the report."""
    import mindspore as ms
    from multimodal_pipeline import build_models, check_and_report, request_stream, run_variants

    ms.set_context(mode=ms.PYNATIVE_MODE)
    stream = request_stream(args.batches, args.batch_size, variance=args.variance, duplicate_share=args.duplicates)
    models = build_models()
    cost, costs = None, None
    if calibrate:
        cost, encode, lm_time = calibrated_costs(stream, *models)
        costs = {"encode_by_side": {int(k): v for k, v in encode.items()}, "lm": lm_time}
    reports = []
    for r in range(1 if calibrate else args.repeat):  # the variants interleaved, so slow phases of the load hit all
        results = run_variants(stream, ahead=args.ahead, threshold=args.threshold, cost_model=cost, models=models,
                               warmup=r == 0)
        if not results["sync"].outputs:
            continue  # an encoder process
        reports.append(check_and_report(stream, results))
    if not reports:
        return None
    report = reports[0]
    report["figures"] = {name: {k: float(np.median([rep["figures"][name][k] for rep in reports]))
                                for k in report["figures"][name]} for name in report["figures"]}
    report["runs"] = len(reports)
    report["false_reuse"] = sum(rep["false_reuse"] for rep in reports)
    report["cache_stats"] = results["async+cache"].cache_stats
    report["costs"] = costs
    return report


def lsh_recall(args) -> dict:
    """Lookups of the stream's images, in order, against every earlier image: LSH vs exact scan."""
    from multimodal_pipeline import request_stream

    from mindspore_hyper.multimodal import FeatureCache, image_signature, signature_dim

    stream = request_stream(max(args.batches, 32), args.batch_size, variance=args.variance,
                            duplicate_share=args.duplicates)
    cache = FeatureCache(signature_dim(16), threshold=args.threshold, capacity=1 << 20)
    seen, true_pairs, found, false_reuse = [], 0, 0, 0
    for batch in stream.batches:
        for rid, image in zip(batch.request_ids, batch.images):
            sig = image_signature(image)
            exact = [k for k, s in seen if float(s @ sig) >= args.threshold]
            match = cache.match(sig)
            if exact:
                true_pairs += 1
                found += match is not None
            false_reuse += match is not None and stream.sources[match.key] != stream.sources[rid]
            cache.insert(sig, np.zeros(1, np.float32), key=rid)
            seen.append((rid, sig))
    return {"lookups": len(seen), "with_match": true_pairs, "found": found, "recall": found / max(1, true_pairs),
            "false_reuse_by_scene": int(false_reuse), "candidates_per_lookup": cache.stats.candidates_checked / len(seen)}


def print_report(title: str, report: dict) -> None:
    sync = report["figures"]["sync"]
    print(f"\n{title}:\nencoder time per batch {report['encode_spread'][0]:+.0%} .. {report['encode_spread'][1]:+.0%} "
          f"of its mean (synchronous run)")
    print(f"{'variant':<12} {'lat. mean':>10} {'lat. p99':>10} {'thr. r/s':>9} {'latency':>9} {'throughput':>11} "
          f"{'enc/LM overlap':>15}")
    for name, f in report["figures"].items():
        print(f"{name:<12} {f['latency_mean'] * 1e3:>7.0f} ms {f['latency_p99'] * 1e3:>7.0f} ms "
              f"{f['throughput']:>9.2f} {f['latency_mean'] / sync['latency_mean'] - 1:>+9.0%} "
              f"{f['throughput'] / sync['throughput']:>10.2f}x {f['overlap'] / f['makespan']:>14.0%}")
    print(f"near-duplicates reused: {report['hits']} of {report['duplicates']}; false reuse: {report['false_reuse']}")


def main():
    args = parse()
    if args.report_dir:
        os.environ.setdefault("MS_HYPER_MODE", "distributed")
        import mindspore as ms

        ms.set_context(runtime_num_threads=1)
        report = measure(args)
        if report is not None:
            with open(os.path.join(args.report_dir, "report.json"), "w") as f:
                json.dump(report, f)
        return
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from msrun_helpers import free_port

    with tempfile.TemporaryDirectory() as out:
        bindir = os.path.dirname(sys.executable)
        env = dict(os.environ, MS_HYPER_MODE="distributed", PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        forwarded = [f"--batches={args.batches}", f"--batch-size={args.batch_size}", f"--duplicates={args.duplicates}",
                     f"--variance={args.variance}", f"--ahead={args.ahead}", f"--threshold={args.threshold}",
                     f"--repeat={args.repeat}"]
        cmd = [os.path.join(bindir, "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
               f"--log_dir={os.path.join(out, 'logs')}", "--join=True", os.path.abspath(__file__),
               f"--report-dir={out}", *forwarded]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            sys.exit(f"msrun failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        with open(os.path.join(out, "report.json")) as f:
            distributed = json.load(f)
    print(f"stream: {args.batches} batches x {args.batch_size} requests, {args.duplicates:.0%} near-duplicates, "
          f"encoder work +-{args.variance:.0%}, ahead {args.ahead}, cache threshold {args.threshold}")
    print_report(f"distributed (encoder rank 0, LM rank 1, one compute thread each; median of {distributed['runs']} "
                 f"runs)", distributed)
    if not args.no_simulation:
        import mindspore_hyper as mh

        mh.set_context(mode="simulation")
        sim = measure(args, calibrate=True)
        costs = sim["costs"]
        print_report("simulation (virtual groups; encoder priced by patch count from the fastest of 3 timed calls; "
                     "measured per resolution: " + ", ".join(f"{s}px {t * 1e3:.0f} ms" for s, t in
                                                             sorted(costs["encode_by_side"].items()))
                     + f"; LM {costs['lm'] * 1e3:.0f} ms per batch)", sim)
    r = lsh_recall(args)
    print(f"\nLSH recall (cache vs exact scan at cosine >= {args.threshold}): {r['found']} of {r['with_match']} "
          f"lookups with a match found ({r['recall']:.1%}); {r['candidates_per_lookup']:.1f} candidates checked per "
          f"lookup over {r['lookups']} lookups; answers from another scene: {r['false_reuse_by_scene']}")
    if distributed["false_reuse"] or r["false_reuse_by_scene"]:
        sys.exit("FALSE REUSE: a request was answered with another image's feature")


if __name__ == "__main__":
    main()
