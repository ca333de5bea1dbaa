"""Checkpoint throughput, the training stall of an asynchronous save, and the elastic restart time.

    python benchmarks/bench_checkpoint.py                 # all three parts
    python benchmarks/bench_checkpoint.py --part io --mb 512 --trials 5
    python benchmarks/bench_checkpoint.py --part stall
    python benchmarks/bench_checkpoint.py --part restart  # two msrun launches

io: a plain Cell of 8 float32 Parameters (--mb in all) saved with `save_checkpoint` (blocking:
shards written chunk by chunk with their CRC32C, fsync of every file and directory, commit by
rename) and loaded with `load_checkpoint` (every chunk read and its CRC32C checked, the
Parameters set), against the raw sequential write (os.write + fsync of one file of the same
bytes) and read (preadv into a numpy buffer) in the same run, interleaved trial by trial (who
goes first alternates); the files' pages are dropped from the page cache (posix_fadvise
DONTNEED, our own files only) before every read, so both reads come from the disk. Prints GB/s and the ratios (goal >= 0.7).

stall: MindSpore layers (16 x Dense(1024, 1024), Adam: 202 MB checkpointed) train steps; a
blocking save is timed; an asynchronous save's stall is the time its call blocks plus the extra
time of the training steps that run while it copies and writes in the background: the same
number of steps is timed just before without a save. Four variants, interleaved in each trial
(who goes first alternating): the snapshot copied in the call or in the background
(`snapshot="background"`, the optimizer's next call waits for it), the file images written
buffered or with O_DIRECT. Prints each ratio (goal <= 0.10) and the save thread's profile (wall
and CPU time of the copy, the write, the fsync and the commit, from the save's fault points),
and, as a figure that a loaded machine disturbs less, the call plus the CPU time of the save's
thread (what the save takes from cores the training would use; the kernel's writeback threads
of buffered writes not counted).

restart: the elastic test's job (tests/checkpoint/elastic_worker.py: 4 processes, one SIGKILLed
while writing its rank file of step 3, resumed on 2) under `run_elastic`: the time from the kill
to the first training step after the resume, against the time from the second attempt's launch
to that step (a cold start of the 2-process job, loading the checkpoint, in the same run).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GB = 1e9


def _drop_cache(path: str) -> None:
    """Drop the page cache of the file `path`, or of every file under the directory `path`
    (clean pages after fsync: all of them)."""
    paths = [path] if os.path.isfile(path) else [os.path.join(folder, name) for folder, _, names in os.walk(path)
                                                 for name in names]
    for name in paths:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _raw_write(path: str, arrays) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for a in arrays:
            view = memoryview(a.reshape(-1).view(np.uint8))
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _raw_read(path: str, nbytes: int) -> float:
    out = np.empty(nbytes, np.uint8)
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        view, done = memoryview(out), 0
        while done < nbytes:
            done += os.preadv(fd, [view[done:]], done)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def bench_io(mb: int, trials: int, work: str) -> None:
    from mindspore import Parameter, Tensor, nn

    import mindspore_hyper as mh

    class Big(nn.Cell):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(0)
            n = mb * (1 << 20) // 4 // 8
            for i in range(8):
                setattr(self, f"w{i}", Parameter(Tensor(rng.standard_normal(n, np.float32)), name=f"w{i}"))

    model = Big()
    arrays = [p.asnumpy() for p in model.get_parameters()]
    nbytes = sum(a.nbytes for a in arrays)
    save, raw_w, load, raw_r = [], [], [], []

    def timed(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    for trial in range(trials):
        root, raw_path = os.path.join(work, f"io{trial}"), os.path.join(work, "raw.bin")
        writes = [lambda: save.append(timed(lambda: mh.save_checkpoint(model, root))),
                  lambda: raw_w.append(_raw_write(raw_path, arrays))]
        reads = [lambda: load.append(timed(lambda: mh.load_checkpoint(model, root))),
                 lambda: raw_r.append(_raw_read(raw_path, nbytes))]
        for run in (writes if trial % 2 == 0 else writes[::-1]):  # alternate who goes first
            run()
        for run in (reads if trial % 2 == 0 else reads[::-1]):
            _drop_cache(root)
            _drop_cache(raw_path)
            run()
        shutil.rmtree(root)
        os.remove(raw_path)
    rate = lambda times: nbytes / statistics.median(times) / GB  # noqa: E731
    print(f"io: {nbytes / GB:.2f} GB in 8 tensors, median of {trials} trials")
    print(f"  save_checkpoint  {rate(save):6.2f} GB/s   raw write + fsync {rate(raw_w):6.2f} GB/s   "
          f"ratio {rate(save) / rate(raw_w):.2f}  (goal >= 0.7)")
    print(f"  load_checkpoint  {rate(load):6.2f} GB/s   raw read (cold)   {rate(raw_r):6.2f} GB/s   "
          f"ratio {rate(load) / rate(raw_r):.2f}  (goal >= 0.7)")


STALL_VARIANTS = (  # (name, snapshot mode, file images written with O_DIRECT)
    ("call + buffered", "call", False),
    ("call + O_DIRECT", "call", True),
    ("background + buffered", "background", False),
    ("background + O_DIRECT", "background", True),
)


def bench_stall(trials: int, work: str) -> None:
    import mindspore as ms
    from mindspore import Tensor, nn

    import mindspore_hyper as mh
    from mindspore_hyper.checkpoint import safetensors_writer
    from mindspore_hyper.checkpoint.faults import set_fault_hook

    ms.set_seed(0)
    layers = [nn.Dense(1024, 1024) for _ in range(16)]
    model = nn.WithLossCell(nn.SequentialCell(layers), nn.MSELoss())
    optimizer = nn.Adam(model.trainable_params(), 1e-4)
    grad = ms.value_and_grad(model, None, optimizer.parameters)
    x = Tensor(np.random.default_rng(1).standard_normal((32, 1024)).astype(np.float32))

    def step():
        start = time.perf_counter()
        _, grads = grad(x, x)
        optimizer(grads)
        return time.perf_counter() - start

    marks = []  # (point, wall time, the thread's CPU time): where the save's thread spends its time
    set_fault_hook(lambda point: marks.append((point.split(":")[0], time.perf_counter(), time.thread_time())))

    def save(root, snapshot, direct):
        safetensors_writer.USE_DIRECT_IO = direct
        return mh.save_checkpoint(model, root, optimizer=optimizer, blocking=False, snapshot=snapshot)

    for _ in range(3):
        step()
    base = statistics.median(step() for _ in range(5))
    windows = {}  # how many steps one asynchronous save of each variant overlaps
    for name, snapshot, direct in STALL_VARIANTS:
        handle = save(os.path.join(work, f"calibrate-{snapshot}-{direct}"), snapshot, direct)
        windows[name] = 1
        while not handle.done():
            step()
            windows[name] += 1
        handle.wait()
    blocking, stalls, calls, phases = [], {n: [] for n, _, _ in STALL_VARIANTS}, {n: [] for n, _, _ in
                                                                                  STALL_VARIANTS}, {}
    for trial in range(trials):
        safetensors_writer.USE_DIRECT_IO = False
        start = time.perf_counter()
        mh.save_checkpoint(model, os.path.join(work, f"block{trial}"), optimizer=optimizer)
        blocking.append(time.perf_counter() - start)
        order = STALL_VARIANTS if trial % 2 == 0 else STALL_VARIANTS[::-1]  # alternate who goes first
        for name, snapshot, direct in order:
            window = windows[name]
            control = sum(step() for _ in range(window))  # the same steps without a save, just before
            del marks[:]
            start = time.perf_counter()
            handle = save(os.path.join(work, f"async{trial}-{snapshot}-{direct}"), snapshot, direct)
            calls[name].append(time.perf_counter() - start)
            treated = sum(step() for _ in range(window))
            if not handle.done():
                print(f"  (trial {trial}, {name}: the save outlasted its {window} steps)")
            handle.wait()
            stalls[name].append(calls[name][-1] + treated - control)
            phases.setdefault(name, []).append(_phases(marks))
    set_fault_hook(None)
    safetensors_writer.USE_DIRECT_IO = True
    b = statistics.median(blocking)
    size = sum(p.asnumpy().nbytes for p in model.trainable_params()) * 3 / 1e6
    print(f"stall: {size:.0f} MB checkpointed (parameters + 2 Adam states), step {base * 1e3:.0f} ms, median of "
          f"{trials} trials; each async save against the same steps without a save just before it; variants "
          "interleaved, who goes first alternating")
    print(f"  blocking save {b * 1e3:7.0f} ms")
    for name, snapshot, _ in STALL_VARIANTS:
        s = statistics.median(stalls[name])
        profile = {k: statistics.median(p[k] for p in phases[name]) for k in phases[name][0]}
        call = statistics.median(calls[name])
        thread_cpu = sum(c for k, (w, c) in profile.items() if k != "copy" or snapshot == "background")
        print(f"  {name:22s} stall {s * 1e3:6.0f} ms (call {call * 1e3:4.0f} ms + the {windows[name]} steps' extra "
              f"time)   ratio {s / b:.3f}  (goal <= 0.10)   call + the save thread's CPU "
              f"{(call + thread_cpu) * 1e3:5.0f} ms, ratio {(call + thread_cpu) / b:.3f}")
        print("      save's thread: " + ", ".join(f"{k} {w * 1e3:.0f} ms wall / {c * 1e3:.0f} ms CPU"
                                                  for k, (w, c) in profile.items()))


def _phases(marks):
    """Wall and CPU time of the save's thread between its fault points: the snapshot copy (in the
    call or in the background), the rank file written, its fsync, the commit; and the wall time
    the training waited at the optimizer's fence (its CPU time: 0, it sleeps)."""
    spans = {"copy": ("snapshot_start", "snapshot_done"), "write": ("file_open", "file_written"),
             "fsync": ("file_written", "file_synced"), "commit": ("all_written", "done")}
    at = {point: (wall, cpu) for point, wall, cpu in marks}
    out = {name: (at[b][0] - at[a][0], at[b][1] - at[a][1]) for name, (a, b) in spans.items()
           if a in at and b in at}
    out["fence"] = (at["snapshot_done"][0] - at["fence_wait"][0], 0.0) if "fence_wait" in at else (0.0, 0.0)
    return out


def bench_restart(work: str) -> None:
    import json

    import mindspore_hyper as mh
    from mindspore_hyper import auto_parallelize
    from mindspore_hyper.launch import run_elastic

    sys.path.insert(0, os.path.join(ROOT, "tests", "checkpoint"))
    from ckpt_models import adam, dense_batches, dense_stack, dense_strategy

    mh.set_context(device_num=8)
    par = auto_parallelize(dense_stack(), dense_strategy(2, 4))
    optimizer = adam(par.optimizer_parameters())
    par.train_step(optimizer, *dense_batches(0, 1)[0])
    mh.save_checkpoint(par, os.path.join(work, "ckpt"), optimizer=optimizer, step=1)
    mh.reset_context()
    worker = os.path.join(ROOT, "tests", "checkpoint", "elastic_worker.py")
    result = run_elastic(worker, [work, 6, 3, 2], nproc=4, nproc_multiple=2, max_restarts=1,
                         log_dir=os.path.join(work, "logs"), attempt_timeout=900)
    with open(os.path.join(work, "kill.json")) as f:
        killed = json.load(f)["time"]
    with open(os.path.join(work, "attempt1_rank0.json")) as f:
        record = json.load(f)
    resumed = record["step_done_at"][str(record["resumed_from"])]
    second = result.attempts[1]
    print(f"restart: {result.attempts[0].world_size} -> {second.world_size} processes, resumed from step "
          f"{record['resumed_from']}")
    print(f"  kill -> first step after resume {resumed - killed:6.1f} s   second attempt's launch -> that step "
          f"{resumed - second.started:6.1f} s   ratio {(resumed - killed) / (resumed - second.started):.2f} "
          "(1 = no time lost beyond the relaunch)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("io", "stall", "restart", "all"), default="all")
    parser.add_argument("--mb", type=int, default=256, help="io: checkpoint size in MB")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    work = tempfile.mkdtemp(prefix="bench_ckpt_", dir=args.dir)
    try:
        if args.part in ("io", "all"):
            bench_io(args.mb, args.trials, work)
        if args.part in ("stall", "all"):
            bench_stall(args.trials, work)
        if args.part in ("restart", "all"):
            bench_restart(os.path.join(work, "restart"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
