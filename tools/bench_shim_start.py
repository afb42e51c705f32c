#!/usr/bin/env python3
"""Benchmark: what the preload library adds to a process start.

    python3 tools/bench_shim_start.py [--runs 200] [--cc cc]

Builds a C program that does nothing (prints nothing, exits 0) and starts it --runs times in
each configuration, interleaved round by round in this one invocation (a busy machine slows all
alike); figures are medians of wall time from fork to exit, measured here with perf_counter.

  plain          the program alone
  shim idle      LD_PRELOAD=libcudatrace.so, no CUDATRACE_DIR: pure pass-through
  shim active    CUDATRACE_DIR set: settings read, unwinder warmed, hooks ready; the trace file
                 is made only at the first CUDA call (every process of a run but the first)
  shim eager     as `cudatrace run` starts its command: the trace file is made at load
  shim + budget  eager, and a budget ledger joined at load (liveness lock included)

Target (issue 13): the shim adds < 5 ms to a process start. Deltas are printed against plain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROG = "int main(void) { return 0; }\n"


def start(argv: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(argv, env=env, check=True)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    args = ap.parse_args()

    from cudatrace import native

    shim = str(native.shim_path())
    with tempfile.TemporaryDirectory(prefix="ct-shimstart-") as tmp:
        tmp = Path(tmp)
        src, exe = tmp / "nothing.c", tmp / "nothing"
        src.write_text(PROG)
        subprocess.run([args.cc, "-O2", "-o", str(exe), str(src)], check=True)
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CUDATRACE_") and k != "LD_PRELOAD"
        }
        trace = tmp / "trace"
        trace.mkdir()
        ldir = tmp / "ledgers"
        ldir.mkdir(mode=0o700)

        from cudatrace.record.ledger import Ledger

        led = Ledger.create(ldir / "bench.ledger", {0: 1 << 30})
        active = dict(base, LD_PRELOAD=shim, CUDATRACE_DIR=str(trace))
        eager = dict(active, CUDATRACE_LAUNCHER_PID=str(os.getpid()))  # we are its parent
        configs = {
            "plain": base,
            "shim idle": dict(base, LD_PRELOAD=shim),
            "shim active": active,
            "shim eager": eager,
            "shim + budget": dict(eager, CUDATRACE_LEDGER=str(led.path)),
        }
        argv = [str(exe)]
        for env in configs.values():  # warm-up
            start(argv, env)
        times: dict[str, list[float]] = {k: [] for k in configs}
        for _ in range(args.runs):
            for name, env in configs.items():
                times[name].append(start(argv, env))
                for f in trace.glob("*"):
                    f.unlink()
        led.close()
    plain = statistics.median(times["plain"])
    print(f"process start, median of {args.runs} (fork to exit, this machine):")
    for name, ts in times.items():
        m = statistics.median(ts)
        extra = "" if name == "plain" else f"  +{(m - plain) * 1000:6.2f} ms  ratio {m / plain:.2f}"
        print(f"  {name:14s} {m * 1000:7.2f} ms{extra}")
    worst = max(statistics.median(t) for t in times.values()) - plain
    print(f"largest delta {worst * 1000:.2f} ms (target < 5 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
