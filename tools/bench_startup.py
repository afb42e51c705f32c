#!/usr/bin/env python3
"""Benchmark: how long `cudatrace run -q -- true` takes next to `python3 -c 'import click'`.

    python3 tools/bench_startup.py [--runs 15] [--python PYTHON]

Both commands run in this one invocation, alternating (so a busy machine slows both alike), each
`--runs` times after one warm-up; the figures are medians of wall time. `true` does nothing, so
the difference is cudatrace's own start-up and end: imports, building the environment, the
sampler, writing run.json. The target (issue 9) is a ratio of at most 2.5.
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
        timed(click_cmd, env)  # warm-up: caches, the native build
        timed(run_cmd, env)
        click_t, run_t = [], []
        for _ in range(args.runs):
            click_t.append(timed(click_cmd, env))
            run_t.append(timed(run_cmd, env))
    c, r = statistics.median(click_t), statistics.median(run_t)
    print(f"python -c 'import click'      median {c * 1000:7.1f} ms  ({args.runs} runs)")
    print(f"cudatrace run -q -- true      median {r * 1000:7.1f} ms  ({args.runs} runs)")
    print(f"ratio {r / c:.2f} (target <= 2.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
