"""cudatrace's added cost per event next to heaptrack's, same run, equivalent loops.

    python3 tools/bench_heaptrack.py [--pairs 200000] [--rounds 5] [--shim DIR]

One C source, built twice: a loop of allocation + free pairs from one call site five frames
below main (a repeated site, as an allocator's hot path is), timed by the program itself
(clock_gettime around the loop, after a warm-up of 1000 pairs), printing ns per pair:

- `malloc` / `free` (what heaptrack traces), run bare and under `heaptrack -o FILE`;
- `cuMemAllocAsync` / `cuMemFreeAsync` on the simulated driver (what cudatrace traces), run bare
  and with the shim preloaded, 64-frame stacks (the default), tracing to a temporary folder.

Rounds alternate the four runs; each figure is the median of the rounds, and the added cost
per event is (traced - bare) / 2 of the medians (a pair is two events). Prints both and their
ratio; `--check RATIO` exits 1 when cudatrace's added ns exceed RATIO x heaptrack's.
Needs heaptrack (Debian: apt-get install heaptrack) and a C compiler.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LOOP_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef CUDA
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuMemAllocAsync(CUdeviceptr *, size_t, void *);
int cuMemFreeAsync(CUdeviceptr, void *);
__attribute__((noinline)) static int pair(void)
{
    CUdeviceptr p = 0;
    if (cuMemAllocAsync(&p, 4096, 0))
        return 1;
    return cuMemFreeAsync(p, 0);
}
#else
__attribute__((noinline)) static int pair(void)
{
    void *volatile p = malloc(4096);
    if (!p)
        return 1;
    free(p);
    return 0;
}
#endif
__attribute__((noinline)) static int f4(void) { int r = pair(); __asm__ volatile("" ::: "memory"); return r; }
__attribute__((noinline)) static int f3(void) { int r = f4(); __asm__ volatile("" ::: "memory"); return r; }
__attribute__((noinline)) static int f2(void) { int r = f3(); __asm__ volatile("" ::: "memory"); return r; }
__attribute__((noinline)) static int f1(void) { int r = f2(); __asm__ volatile("" ::: "memory"); return r; }
int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000;
#ifdef CUDA
    cuInit(0);
#endif
    for (long i = 0; i < 1000; i++)
        if (f1())
            return 1;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        if (f1())
            return 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("%.2f\n", ns / n);
    return 0;
}
"""


def build(work: Path) -> dict:
    from cudatrace import simdriver

    libdir = simdriver.build(str(work / "sim"))["libdir"]
    src = work / "loop.c"
    src.write_text(LOOP_C)
    cc = os.environ.get("CC", "cc")
    exes = {"malloc": work / "loop_malloc", "cuda": work / "loop_cuda"}
    subprocess.run([cc, "-O2", "-g", "-o", str(exes["malloc"]), str(src)], check=True)
    subprocess.run(
        [cc, "-O2", "-g", "-DCUDA", "-o", str(exes["cuda"]), str(src), f"-L{libdir}", "-lcuda"],
        check=True,
    )
    return {"exes": exes, "libdir": str(libdir)}


def timed(cmd: list, env: dict) -> float:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({r.returncode}): {r.stderr[-2000:]}")
    # heaptrack prints its own lines around the program's: the program's is a number alone
    for line in r.stdout.splitlines():
        try:
            return float(line.strip())
        except ValueError:
            continue
    raise SystemExit(f"no timing in the output of {cmd}: {r.stdout[-500:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shim", default=str(REPO / "cudatrace" / "_native"))
    ap.add_argument("--check", type=float, help="fail when cudatrace/heaptrack exceeds this")
    args = ap.parse_args()
    if not shutil.which("heaptrack"):
        print("heaptrack is not installed (Debian: apt-get install heaptrack)", file=sys.stderr)
        return 2
    shim = Path(args.shim) / "libcudatrace.so"
    if not shim.exists():
        from cudatrace import native

        native.ensure_built()
    work = Path(tempfile.mkdtemp(prefix="ct-bench-heaptrack-"))
    try:
        b = build(work)
        n = str(args.pairs)
        base = dict(os.environ, LD_LIBRARY_PATH=b["libdir"])
        runs = {k: [] for k in ("malloc", "heaptrack", "sim", "cudatrace")}
        for rnd in range(args.rounds):
            order = list(runs) if rnd % 2 == 0 else list(reversed(runs))
            for k in order:
                if k == "malloc":
                    runs[k].append(timed([str(b["exes"]["malloc"]), n], base))
                elif k == "heaptrack":
                    out = work / f"ht{rnd}"
                    runs[k].append(
                        timed(["heaptrack", "-o", str(out), str(b["exes"]["malloc"]), n], base)
                    )
                    for f in work.glob(f"ht{rnd}*"):
                        f.unlink()
                elif k == "sim":
                    runs[k].append(timed([str(b["exes"]["cuda"]), n], base))
                else:
                    d = work / f"ct{rnd}"
                    d.mkdir()
                    env = dict(
                        base,
                        LD_PRELOAD=str(shim),
                        LD_BIND_NOW="1",
                        CUDATRACE_DIR=str(d),
                        CUDATRACE_STACK_DEPTH="64",
                    )
                    runs[k].append(timed([str(b["exes"]["cuda"]), n], env))
                    shutil.rmtree(d)
        med = {k: statistics.median(v) for k, v in runs.items()}
        ht = (med["heaptrack"] - med["malloc"]) / 2
        ct = (med["cudatrace"] - med["sim"]) / 2
        print(f"{args.pairs} pairs, 5-deep call stack, one repeated site; medians of {args.rounds}")
        print("ns per pair (bare / traced), spread min-max of the rounds:")
        for k in runs:
            print(f"  {k:10s} {med[k]:9.1f}   ({min(runs[k]):.1f}-{max(runs[k]):.1f})")
        print(f"added ns per event: cudatrace {ct:.1f}, heaptrack {ht:.1f}, ratio {ct / ht:.2f}x")
        if args.check is not None and ct > args.check * ht:
            print(f"FAIL: cudatrace adds more than {args.check}x heaptrack's cost")
            return 1
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
