#!/usr/bin/env python3
"""How long the driver's cuMemAlloc and cuMemFree take, by size, on this machine's GPU 0 (any
CUDA machine; libcuda through ctypes, no framework needed; PyTorch, when installed, only to keep
the device busy for the last case).

    python3 tools/gpu/alloc_latency.py

Why: the report sets NVML's readings beside what the trace held over the span they were read
in, widened by analyze/replay/observed.py's SLACK_NS on each side, because an allocation is stamped
after its call returns and a free before it starts. A call longer than the slack can still show
its memory as untraced in a sample that falls inside it; these figures say how long the calls
are. Prints one line per case (median and max of the repeats, in ms) and the largest call.
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time

MiB = 1 << 20
GiB = 1 << 30
SIZES = (MiB, 256 * MiB, 4 * GiB, 32 * GiB, 96 * GiB)
REPEATS = 5


def driver() -> ctypes.CDLL:
    cu = ctypes.CDLL("libcuda.so.1")

    def ok(r: int, what: str) -> None:
        if r:
            sys.exit(f"alloc_latency: {what} returned CUDA error {r}")

    ok(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    return cu


def one(cu: ctypes.CDLL, size: int, busy=None) -> tuple[float, float] | None:
    """(alloc ms, free ms) of one allocation of size bytes; None when the device refuses it.
    busy(): queue work on the device just before the free (the free then waits for it)."""
    p = ctypes.c_uint64()
    t0 = time.perf_counter_ns()
    r = cu.cuMemAlloc_v2(ctypes.byref(p), size)
    t1 = time.perf_counter_ns()
    if r:
        return None
    if busy:
        busy()
    t2 = time.perf_counter_ns()
    cu.cuMemFree_v2(p)
    t3 = time.perf_counter_ns()
    return (t1 - t0) / 1e6, (t3 - t2) / 1e6


def line(label: str, runs: list[tuple[float, float]]) -> float:
    a = [x for x, _ in runs]
    f = [y for _, y in runs]
    print(
        f"{label:<34} alloc median {statistics.median(a):8.3f} ms max {max(a):8.3f} ms   "
        f"free median {statistics.median(f):8.3f} ms max {max(f):8.3f} ms"
    )
    return max(a + f)


def main() -> int:
    cu = driver()
    worst = 0.0
    for size in SIZES:
        runs = [r for r in (one(cu, size) for _ in range(REPEATS)) if r]
        if not runs:
            print(f"{size // MiB} MiB: the device refused it")
            continue
        worst = max(worst, line(f"{size // MiB} MiB", runs))
    try:
        import torch

        torch.cuda.init()
        spin = lambda: torch.cuda._sleep(50_000_000)  # noqa: E731  (~tens of ms of spinning)
        runs = [r for r in (one(cu, 256 * MiB, spin) for _ in range(REPEATS)) if r]
        if runs:
            worst = max(worst, line("256 MiB, free while a kernel runs", runs))
    except ImportError:
        print("no PyTorch: the free-while-busy case skipped")
    print(f"largest call: {worst:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
