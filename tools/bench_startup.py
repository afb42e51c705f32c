#!/usr/bin/env python3
"""Benchmark: how long `cudatrace run -q -- true` takes next to `python3 -c 'import click'`.

    python3 tools/bench_startup.py [--runs 15] [--python PYTHON]

Both commands run in this one invocation, alternating (so a busy machine slows both alike), each
`--runs` times after one warm-up; the figures are medians of wall time. `true` does nothing, so
the difference is cudatrace's own start-up and end: imports, building the environment, the
sampler, writing run.json. The target (issue 9) is a ratio of at most 2.5.

Issue 13 asks how long before the command STARTS: a C probe that prints CLOCK_MONOTONIC at the
top of main() is run under `cudatrace run` (plain, and with --budget: the ledger's C library
and a liveness lock), and the time from spawning cudatrace to the probe's first instruction is
set against `import click` (target: at most 2.5x). Needs a C compiler (cc or $CC).
Where the time goes: python3 -X importtime -m cudatrace run -q -- true
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

PROBE = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    return 0;
}
"""


def to_start(argv: list[str], env: dict) -> float:
    """Seconds from spawning argv to the probe's main() (the probe prints its clock)."""
    t = time.monotonic_ns()
    r = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    return (int(r.stdout.split()[-1]) - t) / 1e9


def timed(argv: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    args = ap.parse_args()

    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    with tempfile.TemporaryDirectory(prefix="ct-startup-") as tmp:
        click_cmd = [args.python, "-c", "import click"]
        run_cmd = [
            args.python,
            "-m",
            "cudatrace",
            "run",
            "-q",
            "--force",
            "-o",
            str(Path(tmp) / "trace"),
            "--",
            "true",
        ]
        probe = Path(tmp) / "probe"
        (Path(tmp) / "probe.c").write_text(PROBE)
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-O2", "-o", str(probe), str(Path(tmp) / "probe.c")], check=True)
        ldir = Path(tmp) / "ledgers"
        ldir.mkdir(mode=0o700)
        run_base = [
            args.python,
            "-m",
            "cudatrace",
            "run",
            "-q",
            "--force",
            "-o",
            str(Path(tmp) / "trace2"),
        ]
        start_cmds = {
            "plain probe": [str(probe)],
            "cudatrace run -- probe": run_base + ["--", str(probe)],
            "cudatrace run --budget 1GiB": run_base
            + ["--ledger-dir", str(ldir), "--budget", "1GiB", "--", str(probe)],
        }
        timed(click_cmd, env)  # warm-up: caches, the native build
        timed(run_cmd, env)
        for argv in start_cmds.values():
            to_start(argv, env)
        click_t, run_t = [], []
        starts: dict[str, list[float]] = {k: [] for k in start_cmds}
        for _ in range(args.runs):
            click_t.append(timed(click_cmd, env))
            run_t.append(timed(run_cmd, env))
            for k, argv in start_cmds.items():
                starts[k].append(to_start(argv, env))
    c, r = statistics.median(click_t), statistics.median(run_t)
    print(f"python -c 'import click'      median {c * 1000:7.1f} ms  ({args.runs} runs)")
    print(f"cudatrace run -q -- true      median {r * 1000:7.1f} ms  ({args.runs} runs)")
    print(f"ratio {r / c:.2f} (target <= 2.5)")
    print("until the command starts (spawn to the probe's main):")
    for k, v in starts.items():
        m = statistics.median(v)
        print(f"  {k:28s} median {m * 1000:7.1f} ms  = {m / c:.2f} x import click")
    return 0


if __name__ == "__main__":
    sys.exit(main())
