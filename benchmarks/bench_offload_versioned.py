"""Versioned (seqlock) block reads vs a std::shared_mutex block store, 1 writer + 1-2 readers.

Builds ccsrc/tools/bench_versioned_read.cc (g++ -O2) and runs it for several block sizes, with
the writer paced at a fixed rate and unpaced. Prints the read-throughput ratio
(versioned / shared_mutex) measured in the same run.

usage: python benchmarks/bench_offload_versioned.py [--seconds 1.0]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build() -> str:
    exe = os.path.join(tempfile.mkdtemp(prefix="mshyper_bench_"), "bench_versioned_read")
    srcs = ["ccsrc/tools/bench_versioned_read.cc", *(f"ccsrc/store/{name}.cc" for name in
                                                      ("block_store", "block_moves", "memory_tier", "disk_tier", "seqlock", "crc32c"))]
    subprocess.run(["g++", "-std=c++17", "-O2", "-pthread", "-Iccsrc", *srcs, "-o", exe], cwd=ROOT, check=True)
    return exe


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--sizes", default="256,4096,65536,1048576")
    args = ap.parse_args()
    exe = build()
    print(f"{'block':>8} {'writer':>10} {'readers':>7} {'versioned reads/s':>18} {'shared_mutex reads/s':>21} "
          f"{'ratio':>6} {'writes/s v|m':>16}")
    for size in [int(s) for s in args.sizes.split(",")]:
        for rate in (10000, 0):
            out = subprocess.run([exe, str(size), "64", str(args.seconds), str(rate)], capture_output=True,
                                 text=True, check=True).stdout
            for m in re.finditer(r"readers=(\d) versioned: (\d+) reads/s .*?writer (\d+) writes/s \| shared_mutex: "
                                 r"(\d+) reads/s .*?writer (\d+) writes/s \| read ratio ([\d.]+)x", out):
                r, vr, vw, mr, mw, ratio = m.groups()
                print(f"{size:>8} {('%d/s' % rate) if rate else 'unpaced':>10} {r:>7} {int(vr):>18,} {int(mr):>21,} "
                      f"{float(ratio):>5.2f}x {int(vw):>7,}|{int(mw):<8,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
