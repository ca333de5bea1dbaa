"""The data loader against the training step: does `ShardedLoader` keep up with `train_step`?

    python benchmarks/bench_training.py                       # examples/models.py's GPT, 4 simulated devices
    python benchmarks/bench_training.py --layers 2 --hidden 128 --seq 64 --batch 8 --devices 4 --trials 3

A token file of --tokens random ids (uint16) is written to a temporary folder; the GPT (--layers
--hidden --heads --seq --vocab) runs data parallel over --devices simulated devices. Per trial,
interleaved: the step (`train_step` on a batch already made, after one warm-up step), the token
file loader (`ShardedLoader(TokenFile, shuffle=True)`: seeded permutation, memmap reads, packing,
Tensors) over --batches global batches, and the same samples from a `mindspore.dataset`
pipeline read as a stream (GeneratorDataset over the packed samples with an identity `.map`).
Prints the medians, tokens/s of each, and the ratio loader batches per step time (how many
global batches the loader makes while one step runs: > 1 means the loader is not the
bottleneck; it runs in the training loop's thread, so its time adds to the step's: the
"loader share" is the fraction of a step + batch that goes to the batch). The load average is
printed with the results: figures from a loaded machine are not claims. Then the training
essentials' overhead per step (`overhead`): clipping and telemetry, and accumulation, against
plain `train_step`, measured in pairs: each variant's step beside a plain step (alternating
which goes first), the ratio per pair, its median and a distribution-free 95% interval of the
median, so that the machine's drift between trials cancels within a pair.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout, auto_parallelize  # noqa: E402
from mindspore_hyper.data import ShardedLoader, TokenFile  # noqa: E402
from gpt_args import add_gpt_model_arguments  # noqa: E402
from models import GPT  # noqa: E402


def parse_args():
    parser = add_gpt_model_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.set_defaults(layers=2, hidden=128, heads=4, seq=64, vocab=1024)
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument("--devices", type=int, default=4, help="simulated data-parallel devices")
    parser.add_argument("--tokens", type=int, default=1 << 22, help="tokens in the file")
    parser.add_argument("--batches", type=int, default=200, help="global batches the loader makes per trial")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per trial (after one warm-up)")
    parser.add_argument("--trials", type=int, default=3)
    return parser.parse_args()


def time_loader(make, batches: int) -> float:
    """Seconds per global batch of a fresh loader, `batches` of them."""
    loader = make()
    next(loader)  # first batch: the epoch's permutation, a stream's iterator start
    start = time.perf_counter()
    for _ in range(batches):
        next(loader)
    return (time.perf_counter() - start) / batches


def main():
    args = parse_args()
    folder = tempfile.mkdtemp(prefix="bench_training_")
    path = os.path.join(folder, "tokens.bin")
    np.random.RandomState(0).randint(0, args.vocab, args.tokens).astype(np.uint16).tofile(path)
    tokens = TokenFile(path, args.seq)

    mh.set_context(mode="simulation", device_num=args.devices)
    ms.set_seed(0)
    par = auto_parallelize(GPT(args.vocab, args.hidden, args.heads, args.layers, args.seq),
                           Layout((args.devices,), ("data",))(tensor_map=()))
    opt = nn.Adam(par.optimizer_parameters(), learning_rate=1e-4)
    batch = next(ShardedLoader(tokens, args.batch, model=par))
    par.train_step(opt, *batch)  # warm-up

    import mindspore.dataset as ds

    packed = [tokens[i] for i in range(min(len(tokens), (args.batches + 2) * args.batch))]

    def stream_loader():
        pipeline = ds.GeneratorDataset(packed, ["ids", "labels"], shuffle=False).map(lambda v: v, ["ids"])
        return ShardedLoader(pipeline, args.batch, model=par)

    step_s, file_s, stream_s = [], [], []
    for _ in range(args.trials):
        start = time.perf_counter()
        for _ in range(args.steps):
            par.train_step(opt, *batch)
        step_s.append((time.perf_counter() - start) / args.steps)
        file_s.append(time_loader(lambda: ShardedLoader(tokens, args.batch, model=par, seed=1), args.batches))
        stream_s.append(time_loader(stream_loader, min(args.batches, len(packed) // args.batch - 2)))
    step, file, stream = (statistics.median(v) for v in (step_s, file_s, stream_s))
    per_batch = args.batch * args.seq
    print(f"GPT layers={args.layers} hidden={args.hidden} seq={args.seq} vocab={args.vocab}, global batch "
          f"{args.batch} ({per_batch} tokens), {args.devices} simulated devices; {args.trials} trials (medians); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"train_step            {1e3 * step:10.2f} ms/step     {per_batch / step:14,.0f} tokens/s")
    for name, seconds in (("loader: token file", file), ("loader: ms.dataset", stream)):
        print(f"{name:21s} {1e3 * seconds:10.3f} ms/batch    {per_batch / seconds:14,.0f} tokens/s   "
              f"ratio {step / seconds:8.1f} batches per step   loader share {seconds / (seconds + step):6.2%}")

    overhead(par, opt, batch, args)


def overhead(par, opt, batch, args) -> None:
    """The training essentials' cost per step against plain `train_step(opt, ids, labels)`, the same
    global batch, in adjacent pairs: global-norm clipping (`max_grad_norm=1.0`) with the
    telemetry call; then with 4 accumulated micro-batches too (each a quarter of the batch: in a
    simulation that is 4x the op dispatches of one forward/backward, not bookkeeping, so it is
    printed apart from the bookkeeping goal)."""
    from mindspore_hyper.train import Telemetry

    sink = open(os.devnull, "w")
    telemetry = Telemetry(log_every=10 ** 9, stream=sink)
    light = Telemetry(log_every=10 ** 9, stream=sink, report=False)
    tokens = args.batch * args.seq
    runs = {"plain": lambda: par.train_step(opt, *batch),
            "clip": lambda: par.train_step(opt, *batch, max_grad_norm=1.0),
            "telemetry (report=False)": lambda: light.step(par, par.train_step(opt, *batch), tokens=tokens),
            "telemetry (per-step report)": lambda: telemetry.step(par, par.train_step(opt, *batch), tokens=tokens),
            "clip + telemetry": lambda: telemetry.step(par, par.train_step(opt, *batch, max_grad_norm=1.0),
                                                       tokens=tokens),
            "clip + telemetry + accumulation 4": lambda: telemetry.step(
                par, par.train_step(opt, *batch, max_grad_norm=1.0, accumulation_steps=4),
                tokens=args.batch * args.seq)}
    ratios = {name: [] for name in runs if name != "plain"}
    plain_s = []
    for _ in range(args.trials):
        for name in ratios:
            runs[name]()  # one untimed step: a switch between variants costs nothing in the figure
            for pair in range(args.steps):
                order = ("plain", name) if pair % 2 == 0 else (name, "plain")
                seconds = {}
                for which in order:
                    start = time.perf_counter()
                    runs[which]()
                    seconds[which] = time.perf_counter() - start
                plain_s.append(seconds["plain"])
                ratios[name].append(seconds[name] / seconds["plain"])
    plain = statistics.median(plain_s)
    print(f"training essentials per step: each variant step paired with an adjacent plain train_step on the "
          f"same batch (alternating order), {args.trials * args.steps} pairs each; plain step median "
          f"{1e3 * plain:.2f} ms; load average {os.getloadavg()[0]:.2f}")
    for name, values in ratios.items():
        low, high = median_interval(values)
        print(f"  {name:34s} ratio {statistics.median(values):6.3f}  (95% interval of the median "
              f"{low:6.3f} .. {high:6.3f})")


def median_interval(values, confidence: float = 0.95):
    """A distribution-free interval for the median of `values`: the order statistics whose ranks
    the binomial(n, 1/2) distribution puts `confidence` of its mass between (Conover 1999)."""
    from math import comb

    ordered, n = sorted(values), len(values)
    tail, k = 0.0, 0
    while k < n // 2:
        tail_next = tail + comb(n, k) / 2 ** n
        if 2 * tail_next > 1 - confidence:
            break
        tail, k = tail_next, k + 1
    r = max(k, 1)  # X_(r) .. X_(n+1-r), 1-based, covers with 1 - 2 P(B <= r - 1) (too few pairs: min .. max)
    return ordered[r - 1], ordered[n - r]

if __name__ == "__main__":
    main()
