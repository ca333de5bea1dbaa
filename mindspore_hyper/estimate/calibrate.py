"""A `cpu` hardware profile measured on this machine by a short calibration run.

`calibrate_cpu(processes, threads)` starts `processes` worker processes at once (each limited to
`threads` compute threads and bound to cores as distributed mode binds its ranks (flag
`cpu_binding`), so that contention for the cores is part of the measurement; with
processes=1, in this process) and measures, per process, in seconds of wall time:

- matmul FLOP/s: an n x n float32 matrix product (MindSpore's CPU kernel, or numpy's BLAS),
  2 n^3 FLOPs per product: the profile's peak, with matmul efficiency 1;
- memory bandwidth: copying a 64 MiB float32 array, 2 x 64 MiB moved per copy (read + write);
- shared-memory bandwidth: writing 64 MiB into a `multiprocessing.shared_memory` block;
- op overhead: the time of one dependent 4-element add in a chain of 100 (dispatch cost per op
  launch, added to every op's roofline time);
- message latency: half the round trip of a 1-byte message over a pipe between two processes
  (the per-step alpha of the shared-memory transport).

With a job (config and strategy), each process also times the job's ops at their local shapes
(`cpu_kernels.measure_kernels`: the profile's `kernels`, which replace the roofline for those
ops) and, with processes > 1, pairs of processes time the transport's 2-rank AllReduce
(`transport_calibration.measure_all_reduce`), whose alpha-beta fit replaces the pipe latency and
the shared-memory bandwidth; the same pairs then time it after half a layer's forward of work
(the job's MLP GEMM, repeated) without a barrier, in 5 rounds of 10 calls, which gives the peer
wait per collective (`Efficiency.peer_wait`: the median over the rounds of the time a rank waits
for a peer that was descheduled while more processes than cores take turns).

The slowest process's figures make the profile (a step waits for its slowest rank). It is a
`Hardware` with one network level ("shm", every process on this host), efficiency factors 1
and no message overhead (everything measured is already in the figures) but the measured op
overhead, materialised attention (the examples' GPT), the `core_sharing` the figures were
measured under (the cores this process may run on, `processes` x `threads`: a pipeline rank that
computes while others wait runs faster, `core_sharing.py`), and `sources` saying when and how it
was measured; `save_hardware` writes it as a YAML file `load_hardware` reads back.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import statistics
import time
from typing import Dict, List

from mindspore_hyper.context import get_context
from mindspore_hyper.estimate.core_sharing import CoreSharing
from mindspore_hyper.estimate.hardware import Efficiency, Hardware, Level

__all__ = ["calibrate_cpu", "save_hardware", "CALIBRATION_BACKENDS"]

CALIBRATION_BACKENDS = ("mindspore", "numpy")
_COPY_ELEMENTS = 16 << 20  # 64 MiB of float32
SHM_DEVICES = 64  # the "shm" level: processes of one host


def _repeat(fn, seconds: float) -> float:
    """Median seconds of one call of `fn`, called until `seconds` have passed (at least 3 times)."""
    fn()
    times: List[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _worker(backend: str, threads: int, size: int, seconds: float, barrier, queue, rank: int = 0,
            processes: int = 1, job=None, group: str = "") -> None:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    bound = False
    if processes > 1 and get_context("cpu_binding") == "auto":  # on the cores distributed mode gives the ranks
        from mindspore_hyper.runtime.distributed.cpu_binding import bind_to_cores

        bound = bind_to_cores(rank, processes) is not None
    import numpy as np
    from multiprocessing import shared_memory

    a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    if backend == "mindspore":
        from mindspore_hyper.context import apply_host_dispatch

        apply_host_dispatch("distributed")  # the op dispatch the CPU modes run with
        import mindspore as ms
        from mindspore import Tensor, ops

        ms.set_context(mode=ms.PYNATIVE_MODE)
        ms.set_context(runtime_num_threads=threads)
        x = Tensor(a)
        big = Tensor(np.ones(_COPY_ELEMENTS, np.float32))

        def matmul():
            ops.matmul(x, x).asnumpy()

        def copy():
            ops.mul(big, 1.0)[0].asnumpy()

        tiny = Tensor(np.ones(4, np.float32))

        def launches():  # 100 dependent tiny ops: dispatch cost
            y = tiny
            for _ in range(100):
                y = ops.add(y, tiny)
            y.asnumpy()
    else:
        big_np = np.ones(_COPY_ELEMENTS, np.float32)
        out_np = np.empty_like(big_np)

        def matmul():
            a @ a

        def copy():
            np.copyto(out_np, big_np)

        tiny_np = np.ones(4, np.float32)

        def launches():
            y = tiny_np
            for _ in range(100):
                y = y + tiny_np

    shm = shared_memory.SharedMemory(create=True, size=_COPY_ELEMENTS * 4)
    try:
        view = np.ndarray((_COPY_ELEMENTS,), np.float32, buffer=shm.buf)
        source = np.ones(_COPY_ELEMENTS, np.float32)
        barrier.wait()
        result = {"matmul_flops": 2 * size ** 3 / _repeat(matmul, seconds),
                  "memory_Bps": 2 * _COPY_ELEMENTS * 4 / _repeat(copy, seconds),
                  "shm_Bps": _COPY_ELEMENTS * 4 / _repeat(lambda: np.copyto(view, source), seconds),
                  "op_overhead_s": _repeat(launches, seconds) / 100, "bound": bound}
    finally:
        shm.close()
        shm.unlink()
    if job is not None:
        from mindspore_hyper.estimate.cpu_kernels import measure_kernels

        config, strategy = job
        result["kernels"] = measure_kernels(config, strategy, sync=barrier.wait)
        if processes > 1:
            from mindspore_hyper.estimate.transport_calibration import measure_all_reduce

            tokens = config.micro_batch * config.seq_len
            message = int(tokens * config.hidden * 4)
            pairs = processes // 2  # groups of 2, as the job's 2-way tensor and data groups
            if rank < 2 * pairs:
                between = _between_collectives(config, strategy, result["kernels"])
                result["all_reduce"] = measure_all_reduce(f"{group}-{rank // 2}", rank % 2, 2, message,
                                                          repeats=10, compute=between, rounds=5)
    queue.put(result)


def _between_collectives(config, strategy, kernels: Dict[str, tuple]):
    """The job's work between two tensor-parallel collectives: its MLP's first GEMM at the local
    shape (tokens x hidden times hidden x ffn / tensor), repeated to last half a layer's measured
    forward (a layer's forward holds two such collectives)."""
    import numpy as np
    from mindspore import Tensor, ops

    from mindspore_hyper.estimate.layer_ops import kernel_key, layer_forward_ops

    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((config.micro_batch * config.seq_len, config.hidden)).astype(np.float32))
    w = Tensor(rng.standard_normal((config.hidden, max(config.ffn // strategy.tensor, 1))).astype(np.float32))

    def gemm() -> None:
        ops.matmul(x, w).asnumpy()

    layer = sum(kernels[kernel_key(op)][0] for op in layer_forward_ops(config, strategy, "materialized")
                if kernel_key(op) in kernels)
    repeats = max(1, round(layer / 2 / _repeat(gemm, 0.1)))

    def compute() -> None:
        for _ in range(repeats):
            gemm()

    return compute


def _echo(conn) -> None:
    while True:
        message = conn.recv_bytes()
        if not message:
            return
        conn.send_bytes(message)


def _context(backend: str):
    """fork where it is safe and fast (numpy, Linux); spawn for MindSpore (its runtime threads)."""
    if backend == "numpy" and "fork" in mp.get_all_start_methods():
        return mp.get_context("fork")
    return mp.get_context("spawn")


class _Inline:
    """Barrier and queue for measuring in this process (processes=1)."""

    def __init__(self):
        self.items: List[Dict[str, float]] = []

    def wait(self) -> None:
        return None

    def put(self, item: Dict[str, float]) -> None:
        self.items.append(item)


def _pipe_latency(rounds: int = 2000) -> float:
    ctx = _context("numpy")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_echo, args=(there,), daemon=True)
    proc.start()
    try:
        here.send_bytes(b"x")
        here.recv_bytes()
        start = time.perf_counter()
        for _ in range(rounds):
            here.send_bytes(b"x")
            here.recv_bytes()
        return (time.perf_counter() - start) / rounds / 2
    finally:
        here.send_bytes(b"")
        proc.join(timeout=10)


def _measure_inline(backend: str, threads: int, size: int, seconds: float, job) -> List[Dict[str, float]]:
    inline = _Inline()
    _worker(backend, threads, size, seconds, inline, inline, job=job)
    return inline.items


def _measure_processes(processes: int, backend: str, threads: int, size: int,
                       seconds: float, job) -> List[Dict[str, float]]:
    from mindspore_hyper.comm.job_token import job_token

    job_token()  # in this process's environment before the workers start: their groups share it
    ctx = _context(backend)
    barrier, queue = ctx.Barrier(processes), ctx.Queue()
    group = f"calibrate-{os.getpid()}-{time.time_ns()}"
    workers = [ctx.Process(target=_worker, args=(backend, threads, size, seconds, barrier, queue, rank, processes,
                                                 job, group))
               for rank in range(processes)]
    for w in workers:
        w.start()
    results: List[Dict[str, float]] = []
    try:
        for _ in workers:
            results.append(queue.get(timeout=600))
    finally:
        for w in workers:
            w.join(timeout=60)
    if any(w.exitcode for w in workers) or len(results) != processes:
        raise RuntimeError(f"calibrate_cpu: a worker failed (exit codes {[w.exitcode for w in workers]})")
    return results


def calibrate_cpu(processes: int = 1, threads: int = 1, backend: str = "mindspore", size: int = 512,
                  seconds: float = 0.5, config=None, strategy=None) -> Hardware:
    """Measure this machine and return its `cpu` Hardware profile (module doc).

    Args:
        processes: worker processes measured at once (the ranks of the job to predict).
        threads: compute threads per process.
        backend: "mindspore" (its CPU kernels, as the examples run) or "numpy".
        size: n of the n x n matmul.
        seconds: time spent per measurement per process.
        config, strategy: a job (`TransformerConfig`, `JobStrategy`) whose ops are also measured
            at their local shapes (`cpu_kernels.measure_kernels`, mindspore backend only) into the
            profile's `kernels`; with processes > 1, also the 2-process AllReduce of the
            transport at the job's activation size (`transport_calibration`), which replaces the
            "shm" level's copy bandwidth and pipe latency.

    Returns:
        The Hardware profile named "cpu".

    Raises:
        ValueError: a bad argument (named).
        RuntimeError: a worker process failed.
    """
    for name, value in (("processes", processes), ("threads", threads), ("size", size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: expected an int >= 1")
    if backend not in CALIBRATION_BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {', '.join(CALIBRATION_BACKENDS)}")
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r}: expected > 0")
    if (config is None) != (strategy is None):
        raise ValueError("config, strategy: give both (a job to measure) or neither")
    if config is not None and backend != "mindspore":
        raise ValueError(f"backend={backend!r}: the job's kernels are measured with backend='mindspore'")
    job = None if config is None else (config, strategy)
    results = _measure_inline(backend, threads, size, seconds, job) if processes == 1 else \
        _measure_processes(processes, backend, threads, size, seconds, job)
    latency = _pipe_latency()
    slowest = {k: min(r[k] for r in results) for k in ("matmul_flops", "memory_Bps", "shm_Bps")}
    slowest["op_overhead_s"] = max(r["op_overhead_s"] for r in results)
    kernels = {}
    if job is not None:  # the slowest process's time per op (a step waits for its slowest rank)
        kernels = {key: tuple(max(r["kernels"][key][i] for r in results) for i in range(2))
                   for key in results[0]["kernels"]}
    measured = [r["all_reduce"] for r in results if "all_reduce" in r]
    peer_wait = 0.0
    if measured:  # the transport as the runtime pays it: slowest alpha, slowest bandwidth, longest wait
        latency = max(m[0] for m in measured)
        slowest["shm_Bps"] = min(m[1] for m in measured)
        peer_wait = max(m[2] for m in measured)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    how = (f"measured by calibrate_cpu({processes} processes x {threads} threads, {backend}) on {when}, "
           f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Hardware(name="cpu", peak_flops=slowest["matmul_flops"], memory_bytes=int(memory),
                    memory_bandwidth=slowest["memory_Bps"],
                    levels=(Level("shm", SHM_DEVICES, slowest["shm_Bps"], latency),),
                    efficiency=Efficiency(1.0, 1.0, 1.0, 0.0, slowest["op_overhead_s"], peer_wait), attention="materialized",
                    description=f"this machine ({os.cpu_count()} cores), {backend} kernels",
                    sources={k: how for k in ("peak_tflops", "memory_GB", "memory_bandwidth_GBps", "levels.shm",
                                              "latency_us", "efficiency", "core_sharing")
                             + (("kernels",) if kernels else ())},
                    kernels=kernels, core_sharing=CoreSharing(len(os.sched_getaffinity(0)), processes, threads,
                                                           bound=all(r["bound"] for r in results)))


def save_hardware(hardware: Hardware, path: str) -> str:
    """Write `hardware` as a YAML file in the preset format (configs/hardware); returns `path`."""
    import yaml

    data = {"name": hardware.name, "description": hardware.description,
            "peak_tflops": hardware.peak_flops / 1e12, "memory_GB": hardware.memory_bytes / 1e9,
            "memory_bandwidth_GBps": hardware.memory_bandwidth / 1e9,
            "levels": [{"name": lv.name, "devices": lv.devices, "bandwidth_GBps": lv.bandwidth / 1e9,
                        "latency_us": lv.latency * 1e6} for lv in hardware.levels],
            "attention": hardware.attention,
            "efficiency": {"matmul": hardware.efficiency.matmul, "memory": hardware.efficiency.memory,
                           "network": hardware.efficiency.network,
                           "message_overhead_us": hardware.efficiency.message_overhead * 1e6,
                           "op_overhead_us": hardware.efficiency.op_overhead * 1e6,
                           "peer_wait_us": hardware.efficiency.peer_wait * 1e6,
                           **({} if hardware.efficiency.attention is None else
                              {"attention": hardware.efficiency.attention})},
            "sources": dict(hardware.sources)}
    if hardware.kernels:
        data["kernels"] = {k: [f * 1e6, b * 1e6] for k, (f, b) in hardware.kernels.items()}
    if hardware.gemm_tiling is not None:
        tiling = hardware.gemm_tiling
        data["gemm_tiling"] = {"sms": tiling.sms, "tiles": [list(t) for t in tiling.tiles]}
        if tiling.l2_bandwidth is not None:
            data["gemm_tiling"]["l2_bandwidth_GBps"] = tiling.l2_bandwidth / 1e9
    if hardware.core_sharing is not None:
        sharing = hardware.core_sharing
        data["core_sharing"] = {"cores": sharing.cores, "processes": sharing.processes, "threads": sharing.threads,
                                "bound": sharing.bound}
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return path
