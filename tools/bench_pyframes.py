#!/usr/bin/env python3
"""What Python frames add to an event: a Python program calling the driver through ctypes
(the GIL released) from DEPTH Python frames, traced with CUDATRACE_PYTHON=0 (native stacks
only) and =1 (native + Python), alternated in one invocation; an uninstrumented run too.

    python3 tools/bench_pyframes.py [--depth 20] [--pairs 20000] [--rounds 5]
        [--python EXE] [--driver LIBDIR]

--driver: a folder holding libcuda.so.1 (default: the simulated driver, built into a
temporary folder; on a GPU machine pass the real driver's folder, or "system"). Each run
allocates and frees 4 KiB DEPTH frames deep, PAIRS times after a warm-up, and times its own
loop; each pair is two events (alloc and free), each with its stack. Prints medians per event
and the difference: what the Python stack costs per event, against the native-only cost of the
same invocation. Exit status 0 when every run worked.

--instructions N: also run the native and python configurations once under valgrind's
callgrind (N pairs) and print the instructions per event each executes, and the difference:
a figure a busy machine does not disturb.
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

PROG = r"""
import ctypes, sys, time
depth, pairs = int(sys.argv[1]), int(sys.argv[2])
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
dev = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
alloc, free = cuda.cuMemAlloc_v2, cuda.cuMemFree_v2
p = ctypes.c_uint64(); ref = ctypes.byref(p); size = ctypes.c_size_t(4096)

def loop(n):
    for _ in range(n):
        alloc(ref, size)
        free(p)

def nest(k, n):
    if k > 1:
        return nest(k - 1, n)
    loop(n)                       # loop itself is the innermost of `depth` Python frames
    t0 = time.perf_counter_ns()
    loop(n)
    return time.perf_counter_ns() - t0

# depth counts the frames in nest + loop + the module's: nest is called depth-2 times deep
print(nest(max(1, depth - 2), pairs))
"""


def run_once(py: str, prog: Path, depth: int, pairs: int, env: dict, trace: Path | None) -> float:
    if trace is None:
        cmd = [py, str(prog), str(depth), str(pairs)]
    else:
        cmd = [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-q",
            "--force",
            "-o",
            str(trace),
            "--",
            py,
            str(prog),
            str(depth),
            str(pairs),
        ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError("{} failed:\n{}{}".format(" ".join(cmd), r.stdout, r.stderr))
    ns = int(r.stdout.strip().splitlines()[-1])
    return ns / (2 * pairs)  # per event


def instructions(py: str, prog: Path, depth: int, pairs: int, env: dict, tmp: Path) -> int:
    """Instructions the whole process executed (callgrind), the shim preloaded directly."""
    from cudatrace import native

    out = tmp / "cg.out"
    tdir = tmp / "cg-trace"
    shutil.rmtree(tdir, ignore_errors=True)
    tdir.mkdir()
    e = dict(env, CUDATRACE_DIR=str(tdir), LD_PRELOAD=str(native.shim_path()))
    r = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            py,
            str(prog),
            str(depth),
            str(pairs),
        ],
        env=e,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if r.returncode != 0:
        raise RuntimeError("callgrind run failed:\n" + r.stderr[-3000:])
    for line in r.stderr.splitlines():
        if "Collected :" in line or "I   refs:" in line:
            return int(line.split()[-1].replace(",", ""))
    raise RuntimeError("no instruction count in callgrind's output")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--driver", default=None)
    ap.add_argument("--instructions", type=int, default=0, metavar="PAIRS")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_pyframes-"))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if a.driver != "system":
        libdir = a.driver
        if libdir is None:
            sys.path.insert(0, str(REPO))
            from cudatrace import simdriver

            libdir = str(simdriver.build(tmp / "sim")["libdir"])
        env["LD_LIBRARY_PATH"] = libdir + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    prog = tmp / "bench.py"
    prog.write_text(PROG)
    configs = ("bare", "native", "python")
    res: dict[str, list[float]] = {c: [] for c in configs}
    for rnd in range(a.rounds):
        order = configs if rnd % 2 == 0 else tuple(reversed(configs))
        for c in order:
            e = dict(env)
            if c != "bare":
                e["CUDATRACE_PYTHON"] = "1" if c == "python" else "0"
            res[c].append(
                run_once(
                    a.python,
                    prog,
                    a.depth,
                    a.pairs,
                    e,
                    None if c == "bare" else tmp / ("trace-" + c),
                )
            )
    med = {c: statistics.median(v) for c, v in res.items()}
    ver = subprocess.run(
        [a.python, "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(
        "bench_pyframes: CPython %s, %d Python frames, %d alloc/free pairs x %d rounds, driver %s"
        % (ver, a.depth, a.pairs, a.rounds, a.driver or "simulated")
    )
    print("  %-8s %12s %22s" % ("config", "ns/event", "min-max"))
    for c in configs:
        print("  %-8s %12.0f %10.0f-%-10.0f" % (c, med[c], min(res[c]), max(res[c])))
    native_cost = med["native"] - med["bare"]
    added = med["python"] - med["native"]
    print(
        "  native-only tracing adds {:.0f} ns per event; Python frames add {:.0f} ns per event more "
        "({} the native-only event cost; target: at most 1000 ns)".format(
            native_cost,
            added,
            f"{added / native_cost:.2f}x" if native_cost > 0 else "no ratio to",
        )
    )
    if a.instructions:
        sys.path.insert(0, str(REPO))
        ir = {}
        for c in ("native", "python"):
            e = dict(env, CUDATRACE_PYTHON="1" if c == "python" else "0")
            ir[c] = instructions(a.python, prog, a.depth, a.instructions, e, tmp)
        # the program runs its loop twice (warm-up, timed): 4 events per pair
        per = (ir["python"] - ir["native"]) / (4 * a.instructions)
        print(
            "  callgrind, %d pairs: whole process %d instructions native-only, %d with Python "
            "frames: %.0f instructions more per event"
            % (a.instructions, ir["native"], ir["python"], per)
        )
    trace = tmp / "trace-python"
    sys.path.insert(0, str(REPO))
    from cudatrace.analyze.read.trace import iter_events, read_dir

    t = read_dir(trace).traces[0]
    leaves = {e["stack"] for _, e in zip(range(2000), iter_events(t))}
    depths = {len(t.py_stack(leaf)) for leaf in leaves if leaf}
    print(f"  Python frames recorded per event: {sorted(depths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
