"""Point-to-point throughput of comm.p2p.P2PChannel between two processes vs the bare transport.

Baseline (same run, same two processes): the framing the pipeline used before comm/p2p.py, a
fixed int64 header then the data on a raw two-member ShmCommunicator, written by the sending
process's main thread. Measured: P2PChannel (send queued to its thread without a copy, a
flush every `--window` messages as a pipeline step does, receive by tag). Each case sends
`--messages` messages of one float32 array; the receiver's clock runs from the first message to
the last (steady state; the rendezvous and first message are excluded). Prints microseconds per
message and the ratio.

    python benchmarks/bench_p2p.py [--messages 1000] [--window 8] [--sizes 512,1048576]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import time
import uuid

import numpy as np

_HEADER = 16  # int64 words, as the pipeline's former header


def _raw_send(job: str, n: int, size: int) -> None:
    from mindspore_hyper.comm.shm import one_way_channel

    comm = one_way_channel(job, "raw", 0, 1, 0, 60.0)
    arr, header = np.ones(size, np.float32), np.zeros(_HEADER, np.int64)
    for _ in range(n):
        comm.send(header, 1)
        comm.send(arr, 1)
    comm.barrier()
    comm.close()


def _raw_recv(job: str, n: int, size: int) -> float:
    from mindspore_hyper.comm.shm import one_way_channel

    comm = one_way_channel(job, "raw", 0, 1, 1, 60.0)
    for i in range(n):
        comm.recv((_HEADER,), np.int64, 0)
        comm.recv((size,), np.float32, 0)
        if i == 0:
            start = time.perf_counter()
    elapsed = time.perf_counter() - start
    comm.barrier()
    comm.close()
    return elapsed


def _channel_send(job: str, n: int, size: int, window: int) -> None:
    from mindspore_hyper.comm.p2p import P2PChannel

    arr = np.ones(size, np.float32)
    with P2PChannel(job, "ch", 0, 1, 0, 60.0) as channel:
        for i in range(n):
            channel.send((0, 0, 1, i), [arr], copy=False)
            if (i + 1) % window == 0:
                channel.flush()


def _channel_recv(job: str, n: int, size: int) -> float:
    from mindspore_hyper.comm.p2p import P2PChannel

    with P2PChannel(job, "ch", 0, 1, 1, 60.0) as channel:
        for i in range(n):
            channel.recv((0, 0, 1, i))
            if i == 0:
                start = time.perf_counter()
        return time.perf_counter() - start


def _sender(job: str, n: int, sizes, window: int) -> None:
    for size in sizes:
        _raw_send(job + f"r{size}", n, size)
        _channel_send(job + f"c{size}", n, size, window)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000, help="messages per case (default 1000)")
    parser.add_argument("--window", type=int, default=8, help="P2PChannel sends between flushes (default 8)")
    parser.add_argument("--sizes", default="512,1048576", help="float32 elements per message, comma-separated")
    args = parser.parse_args()
    if args.messages < 2:
        parser.error("--messages: expected at least 2")
    if args.window < 1:
        parser.error("--window: expected at least 1")
    sizes = [int(s) for s in args.sizes.split(",")]
    job = "bp2p" + uuid.uuid4().hex[:8]
    child = mp.get_context("spawn").Process(target=_sender, args=(job, args.messages, sizes, args.window))
    child.start()
    print(f"{args.messages} messages per case, float32 arrays, 2 processes, P2PChannel flush every {args.window}")
    print(f"{'bytes/message':>14} {'raw header+data us/msg':>24} {'P2PChannel us/msg':>18} {'ratio':>7}")
    for size in sizes:
        raw = _raw_recv(job + f"r{size}", args.messages, size) / (args.messages - 1)
        channel = _channel_recv(job + f"c{size}", args.messages, size) / (args.messages - 1)
        print(f"{size * 4:>14} {raw * 1e6:>24.1f} {channel * 1e6:>18.1f} {channel / raw:>6.2f}x")
    child.join(120)
    if child.exitcode != 0:
        raise SystemExit(f"the sending process failed (exit code {child.exitcode})")


if __name__ == "__main__":
    main()
