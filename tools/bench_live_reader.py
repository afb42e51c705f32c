"""bench_live_reader.py - does reading the in-process API slow the allocating threads?

On the simulated driver, under the shim: THREADS threads (C loops started through ctypes, so
they run without the GIL) each make PAIRS cuMemAllocAsync + cuMemFreeAsync pairs of 1 MiB, first
alone, then while a Python thread reads cudatrace.stats(), cudatrace.snapshot() and opens and
closes a mark in a tight loop, and beside a Python thread that spins without reading (what the
cores alone take away); alternated ROUNDS times, medians printed, same invocation:

    python3 tools/bench_live_reader.py [--threads 1] [--pairs 200000] [--rounds 3]

The reader takes no lock the allocation path takes (native/shim/live.c), so the allocation rate
with the reader should differ from the rate without it only by what the machine's cores give
(the reader busies one core: keep THREADS + 1 at or under the core count to see the shim alone).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOOP_C = r"""
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned int);
int cuMemAllocAsync(CUdeviceptr *, unsigned long, void *);
int cuMemFreeAsync(CUdeviceptr, void *);
long pairs(long n)
{
    for (long i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        if (cuMemAllocAsync(&p, 1 << 20, 0) || cuMemFreeAsync(p, 0))
            return -1;
    }
    return n;
}
"""


def child(args) -> int:
    import ctypes

    import cudatrace

    if not cudatrace.active():
        print("bench_live_reader: the shim is not loaded", file=sys.stderr)
        return 1
    lib = ctypes.CDLL(args.loop)
    lib.pairs.argtypes = [ctypes.c_long]
    lib.pairs.restype = ctypes.c_long
    ctypes.CDLL("libcuda.so.1").cuInit(0)
    lib.pairs(1000)  # warm: the table's pages, the stack cache

    def alloc_rate() -> float:
        ts = [threading.Thread(target=lib.pairs, args=(args.pairs,)) for _ in range(args.threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return args.threads * args.pairs / (time.perf_counter() - t0)

    reads = [0]

    def reader(stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            cudatrace.stats()
            cudatrace.snapshot()
            with cudatrace.mark() as m:
                m.peak()
            n += 1
        reads[0] = n

    def busy(stop: threading.Event) -> None:  # the same Python loop, without the API
        n = 0
        while not stop.is_set():
            sum(range(64))
            n += 1

    def with_thread(target) -> tuple[float, float]:
        stop = threading.Event()
        r = threading.Thread(target=target, args=(stop,))
        t0 = time.perf_counter()
        r.start()
        rate = alloc_rate()
        stop.set()
        r.join()
        return rate, reads[0] / (time.perf_counter() - t0)

    bare, spin, read, rps = [], [], [], []
    for _ in range(args.rounds):
        bare.append(alloc_rate())
        spin.append(with_thread(busy)[0])
        rate, per_s = with_thread(reader)
        read.append(rate)
        rps.append(per_s)
    b, sp, w = statistics.median(bare), statistics.median(spin), statistics.median(read)
    s = cudatrace.stats()
    print(
        f"allocation rate ({args.threads} thread(s), {args.pairs} async pairs each, median of "
        f"{args.rounds}, {os.cpu_count()} cores):\n"
        f"  alone                          {b:12,.0f} pairs/s\n"
        f"  beside a busy Python thread    {sp:12,.0f} pairs/s  ({sp / b:.2f} of alone)\n"
        f"  beside a thread reading the API {w:11,.0f} pairs/s  ({w / b:.2f} of alone, "
        f"{w / sp:.2f} of beside the busy thread)\n"
        f"  the reader made {statistics.median(rps):,.0f} reads/s (stats + snapshot + mark)"
    )
    print(f"counted: {s.allocs:,} allocations, {s.frees:,} frees, {s.live} bytes live at the end")
    return 0 if s.live == 0 and s.allocs == s.frees else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loop", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop:
        return child(args)
    from cudatrace import native, simdriver

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        libdir = simdriver.build(t / "sim")["libdir"]
        (t / "loop.c").write_text(LOOP_C)
        loop = t / "libloop.so"
        subprocess.run(
            ["cc", "-O2", "-shared", "-fPIC", "-o", loop, t / "loop.c", f"-L{libdir}", "-lcuda"],
            check=True,
        )
        env = dict(os.environ)
        env.update(
            LD_PRELOAD=str(native.shim_path()),
            LD_LIBRARY_PATH=f"{libdir}:{env.get('LD_LIBRARY_PATH', '')}",
            CUDATRACE_DIR=str(t / "trace"),
            PYTHONPATH=f"{ROOT}:{env.get('PYTHONPATH', '')}",
        )
        (t / "trace").mkdir()
        cmd = [sys.executable, __file__, "--loop", str(loop)]
        cmd += ["--threads", str(args.threads), "--pairs", str(args.pairs)]
        cmd += ["--rounds", str(args.rounds)]
        return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
