"""Kernel launches and copies of one training step, single device vs 8 simulated devices: a count,
the same on a loaded machine (the measure to compare simulation code by; times are not).

    python benchmarks/count_sim_kernels.py --layers 1          # bench_sim_overhead's model, 1 layer

Each side runs in a fresh process with MindSpore's debug log on (GLOG_v=0: several hundred
thousand lines, parsed as they arrive): one warm-up step, then one counted step of
bench_sim_overhead.py's model, mesh and strategy. Counted from MindSpore's own log lines:

  * kernels: "LaunchKernel] <op> Launch end" (PyBoost kernels), "RunInner] RunOp name <op>" (ops
    still on the older op runner: Identity, BiasAdd, LayerNorm, Gather, Stack, ZerosLike) and
    "CopyCustomizeCall] Launch end": the copy a CPU kernel makes of an input that is a view
    (a split piece, a reshape, a transpose) before it runs;
  * forward is everything before the first "Begin CallBackward", backward the rest of
    value_and_grad (backward nodes: "Begin CallBackward" lines). The backward's kernels on the
    older runner (LayerNorm's, BiasAdd's gradients) do not log a launch line, so the backward
    count is a lower bound, the same for both sides; the optimizer's update runs as a compiled
    graph and is not counted;
  * copied bytes: each view copy's shape (its "Input_storage_info" line) x 4 bytes (float32).
"""
import argparse
import collections
import json
import math
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt_args import add_gpt_model_arguments  # noqa: E402

LAUNCH = re.compile(r"LaunchKernel\] (\S+) Launch end|RunInner\] RunOp name (\S+) device")
STORAGE = re.compile(r"Input_storage_info:TensorStorageInfo\(shape=\[([0-9, ]*)\]")
BACKWARD = re.compile(r"Begin CallBackward: (\S+)")
COPY = "CopyCustomizeCall] Launch end"
START, BACKWARD_END = "COUNT_STEP_START", "COUNT_BACKWARD_END"


def worker(args) -> None:
    """In the child: one warm-up step, then the counted one between markers on stderr."""
    import mindspore as ms
    from mindspore import Tensor, nn

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
    import mindspore_hyper as mh
    from bench_sim_overhead import DEVICES, strategy
    from gpt_args import initial_weights, load_mindspore_weights, token_batch
    from models import GPT

    ms.runtime.launch_blocking()
    ms.set_seed(0)
    mh.set_context(mode="simulation", device_num=DEVICES)
    cfg = dict(vocab=args.vocab, hidden=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq)
    batch = tuple(Tensor(a) for a in token_batch(args.vocab, args.batch, args.seq))
    model = GPT(**cfg)
    load_mindspore_weights(model, initial_weights(**cfg))
    net = mh.auto_parallelize(model, strategy()) if args.worker == "simulated" else model
    optimizer = nn.AdamWeightDecay(model.trainable_params(), learning_rate=1e-4)
    step = ms.value_and_grad(net, None, optimizer.parameters)
    losses = []
    for i in range(2):
        if i == 1:
            print(START, file=sys.stderr, flush=True)
        loss, grads = step(*batch)
        if i == 1:
            print(BACKWARD_END, file=sys.stderr, flush=True)
        optimizer(grads)
        losses.append(float(loss.asnumpy()))
    print(json.dumps({"losses": losses}), flush=True)


def count(side: str, args) -> dict:
    """Run one side in a child process and count its log lines (see the module docstring)."""
    cmd = [sys.executable, __file__, "--worker", side] + [f"--{k}={getattr(args, k)}" for k in
                                                           ("layers", "hidden", "heads", "seq", "vocab", "batch")]
    env = dict(os.environ, GLOG_v="0", GLOG_logtostderr="1")
    kernels = {"forward": collections.Counter(), "backward": collections.Counter()}
    copied = collections.Counter()
    nodes, phase, shape, counting = 0, "forward", "", False
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=env)
    for line in proc.stderr:
        if START in line:
            counting = True
            continue
        if not counting:
            continue
        if BACKWARD_END in line:
            counting = False
            continue
        if BACKWARD.search(line):
            phase, nodes = "backward", nodes + 1
            continue
        found = STORAGE.search(line)
        if found:
            shape = found.group(1)
            continue
        found = LAUNCH.search(line)
        if found:
            kernels[phase][found.group(1) or found.group(2)] += 1
        elif COPY in line:
            kernels[phase]["copy of a view"] += 1
            copied[phase] += 4 * math.prod(int(n) for n in shape.split(",") if n.strip())
    out = proc.stdout.read()
    if proc.wait() != 0:
        sys.exit(f"the {side} side failed (exit {proc.returncode}): {out[-2000:]}")
    return {"kernels": {p: dict(c) for p, c in kernels.items()},
            "launches": {p: sum(c.values()) for p, c in kernels.items()},
            "copies": {p: c["copy of a view"] for p, c in kernels.items()},
            "copied_bytes": dict(copied), "backward_nodes": nodes, "losses": json.loads(out.splitlines()[-1])["losses"]}


def main():
    parser = add_gpt_model_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--json", metavar="PATH", help="also write the counts as JSON to PATH")
    parser.add_argument("--worker", choices=("single", "simulated"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("layers", "hidden", "heads", "seq", "vocab", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive integer, got {getattr(args, name)}")
    if args.worker:
        return worker(args)
    result = {side: count(side, args) for side in ("single", "simulated")}
    print(f"GPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, seq {args.seq}, vocab {args.vocab}, "
          f"batch {args.batch}; simulated: data 2 x tensor 4 (bench_sim_overhead.py); one step after a warm-up")
    print(f"{'':<24}{'single':>12}{'simulated':>12}")
    for phase in ("forward", "backward"):
        for what, key, scale in (("kernel launches", "launches", 1), ("  of which view copies", "copies", 1),
                                 ("  view copies, MB", "copied_bytes", 1e-6)):
            row = [result[s][key].get(phase, 0) * scale for s in ("single", "simulated")]
            print(f"{phase + ' ' + what if not what.startswith(' ') else what:<24}"
                  + "".join(f"{v:>12.1f}" if scale != 1 else f"{v:>12d}" for v in row))
    print(f"{'backward nodes':<24}{result['single']['backward_nodes']:>12}{result['simulated']['backward_nodes']:>12}")
    for side in ("single", "simulated"):
        top = collections.Counter(result[side]["kernels"]["forward"]).most_common(8)
        print(f"{side} forward, most launched: " + ", ".join(f"{n} {c}" for n, c in top))
    print("losses (warm-up, counted step): single " + ", ".join(repr(v) for v in result["single"]["losses"])
          + "; simulated " + ", ".join(repr(v) for v in result["simulated"]["losses"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
