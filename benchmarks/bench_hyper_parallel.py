"""The HyperParallel API's cost: a tensor-parallel Llama step written with the API
(`parallelize_module`, Colwise/Rowwise styles, attention on each device's heads) against the same
model and weights through `auto_parallelize` (a Megatron strategy), each divided by the
single-device step measured in the same run. Goal: the API adds <= 5% (API / auto_parallelize).

    python benchmarks/bench_hyper_parallel.py                       # simulation, tensor 4
    python benchmarks/bench_hyper_parallel.py --distributed         # msrun, 4 processes (each rank times)

Each variant trains --repeat + 1 steps (the first is warm-up) from the same weights on the same
batch; their losses are asserted equal to float32 rounding before any time is printed. Timings
are medians; the machine's load average is printed before and after.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout, auto_parallelize  # noqa: E402
from mindspore_hyper.hyper_parallel import install_hyper_parallel  # noqa: E402

install_hyper_parallel()
import hyper_parallel_llama as example  # noqa: E402
from hyper_parallel import init_device_mesh, parallelize_module  # noqa: E402

TP = 4


def megatron(layers: int):
    """The example's PLAN as this package's own Strategy (same splits of every weight)."""
    s = Layout((TP,), ("tensor",))(tensor_map=())
    s.override("tok_embeddings.*", "tensor").override("output.weight", "tensor")
    for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3"):
        s.override(f"layers.*.{name}.weight", "tensor")
    for name in ("attention.wo", "feed_forward.w2"):
        s.override(f"layers.*.{name}.weight", None, "tensor")
    return s


def time_steps(step, repeat):
    times, losses = [], []
    for i in range(repeat + 1):
        start = time.perf_counter()
        losses.append(float(step()))
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times), losses


def adam_step(model, call, params):
    optimizer = nn.Adam(params, learning_rate=1e-3)
    grad_fn = ms.value_and_grad(call, None, optimizer.parameters)

    def step():
        loss, grads = grad_fn()
        optimizer(grads)
        return loss
    return step


def copy_weights(source, target):
    for (_, p), (_, q) in zip(source.parameters_and_names(), target.parameters_and_names()):
        q.set_data(Tensor(p.asnumpy()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--distributed", action="store_true", help=f"run under msrun with {TP} processes")
    args = parser.parse_args()
    if args.distributed and "MS_WORKER_NUM" not in os.environ and "MS_ROLE" not in os.environ:
        cli = os.path.join(os.path.dirname(sys.executable), "mindspore-hyper")
        argv = [a for a in sys.argv[1:] if a != "--distributed"]
        log_dir = tempfile.mkdtemp(prefix="bench_hyper_parallel_log_")  # msrun's worker logs, outside the checkout
        print(f"msrun logs: {log_dir}", flush=True)
        return subprocess.call([cli, "msrun", f"--worker_num={TP}", f"--local_worker_num={TP}", "--master_port=8127",
                                f"--log_dir={log_dir}", "--join=True", os.path.abspath(__file__),
                                "--distributed", *argv], env=dict(os.environ, MS_HYPER_MODE="distributed"))
    load_before = os.getloadavg()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.runtime.launch_blocking()  # the simulation's setting, for every variant alike
    if args.distributed:
        mh.set_context(mode="distributed")
    else:
        mh.set_context(mode="simulation", device_num=TP)
    size = dict(vocab=args.vocab, dim=args.dim, heads=args.heads, hidden=args.hidden, layers=args.layers)
    rng = np.random.RandomState(0)
    ids = Tensor(rng.randint(0, args.vocab, (args.batch, args.seq)).astype(np.int32))
    labels = Tensor(rng.randint(0, args.vocab, (args.batch, args.seq)).astype(np.int32))

    ms.set_seed(0)
    single = example.Llama(tp=1, **size)
    api_model, auto_model = example.Llama(tp=TP, **size), example.Llama(tp=1, **size)
    copy_weights(single, api_model)
    copy_weights(single, auto_model)

    base, base_losses = time_steps(adam_step(single, lambda: single(ids, labels), single.trainable_params()),
                                   args.repeat)
    parallelize_module(api_model, init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",)), example.PLAN)
    api, api_losses = time_steps(adam_step(api_model, lambda: api_model(ids, labels), api_model.trainable_params()),
                                 args.repeat)
    wrapped = auto_parallelize(auto_model, megatron(args.layers))
    auto, auto_losses = time_steps(adam_step(wrapped, lambda: wrapped(ids, labels), wrapped.optimizer_parameters()),
                                   args.repeat)
    # Adam moves every weight by ~lr per step; sharded vs whole float32 sums differ by rounding only
    np.testing.assert_allclose(api_losses, base_losses, rtol=1e-4)
    np.testing.assert_allclose(auto_losses, base_losses, rtol=1e-4)
    where = f"msrun rank {mh.get_context('mode') == 'distributed' and os.environ.get('RANK_ID')}" if args.distributed \
        else f"simulation, {TP} devices"
    print(f"model: Llama {size}, batch {args.batch} x seq {args.seq}; tensor {TP} ({where})")
    print(f"losses equal over {args.repeat + 1} steps: {' '.join(f'{x:.5f}' for x in base_losses)}")
    print(f"single-device step:         median {base:.3f} s")
    print(f"HyperParallel API step:     median {api:.3f} s   {api / base:.2f}x single device")
    print(f"auto_parallelize step:      median {auto:.3f} s   {auto / base:.2f}x single device")
    print(f"ratio API / auto_parallelize: {api / auto:.3f}   (goal <= 1.05)")
    from mindspore_hyper.hyper_parallel.session import session_executions

    api_fallbacks = {k: v for e in session_executions() for k, v in e.accounting.fallbacks.items()}
    print(f"ops run replicated (no sharding rule) per step: auto_parallelize {dict(wrapped.accounting.fallbacks) or 'none'}; "
          f"API over all its steps {api_fallbacks or 'none'}")
    print(f"load average before {tuple(round(x, 2) for x in load_before)}, after "
          f"{tuple(round(x, 2) for x in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())
