#!/usr/bin/env python3
"""Where the instructions the shim adds to one async alloc+free pair go, by function.

    python3 tools/callgrind_parts.py SHIMDIR [--depth 64] [--pairs 2000] [--min 1]

The companion of tools/bench_callgrind.sh (which prints the totals): the same loop
(tools/bench_pairs.c) on the simulated driver, run under callgrind with PAIRS and 2*PAIRS pairs,
bare and with the shim of SHIMDIR preloaded (stacks of --depth frames). Each function's
exclusive count, with the code inlined into it attributed to the source file it came from
(callgrind_annotate's `file:function` rows), is differenced between the two runs (start-up and
exit cancel) and divided by PAIRS; the bare run's rows are subtracted. The rows are what
docs/performance.md's "where the instructions go" tables sum up. x86-64 only (valgrind).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"\s*([\d,]+) \([^)]*\)\s+(\S.*)$")


def build_bench(work: Path) -> tuple[Path, Path]:
    """(bench_pairs binary, simulated driver's library folder)"""
    sys.path.insert(0, str(ROOT))
    from cudatrace import simdriver

    libdir = Path(simdriver.build(str(work / "lib"))["libdir"])
    exe = work / "bench_pairs"
    cc = os.environ.get("CC", "cc")
    subprocess.run(
        [cc, "-O2", "-g", f"-I{ROOT / 'native/include'}", "-o", str(exe),
         str(ROOT / "tools/bench_pairs.c"), f"-L{libdir}", "-lcuda"],
        check=True,
    )  # fmt: skip
    return exe, libdir


def rows(exe: Path, libdir: Path, work: Path, n: int, env: dict) -> dict[str, int]:
    """callgrind's exclusive count of every file:function of one run of n pairs"""
    out = work / f"cg.{n}"
    trace = work / "trace"
    shutil.rmtree(trace, ignore_errors=True)
    trace.mkdir()
    e = dict(os.environ, LD_LIBRARY_PATH=str(libdir), CUDATRACE_DIR=str(trace), **env)
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", str(exe), str(n)],
        env=e, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    ann = subprocess.run(
        ["callgrind_annotate", "--auto=no", "--threshold=100", str(out)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    d: dict[str, int] = {}
    for line in ann.splitlines():
        m = ROW.match(line)
        if not m or ":" not in m.group(2) or "PROGRAM" in m.group(2):
            continue
        key = re.sub(r" \[.*\]$", "", m.group(2))
        d[key] = d.get(key, 0) + int(m.group(1).replace(",", ""))
    return d


def per_pair(exe: Path, libdir: Path, work: Path, pairs: int, env: dict) -> dict[str, float]:
    a = rows(exe, libdir, work, pairs, env)
    b = rows(exe, libdir, work, 2 * pairs, env)
    return {k: (b.get(k, 0) - a.get(k, 0)) / pairs for k in set(a) | set(b)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shimdir", type=Path, help="folder holding libcudatrace.so")
    ap.add_argument("--depth", type=int, default=64, help="CUDATRACE_STACK_DEPTH (default 64)")
    ap.add_argument("--pairs", type=int, default=2000, help="pairs of the shorter run (2000)")
    ap.add_argument("--min", type=float, default=1.0, help="rows below this are left out (1)")
    args = ap.parse_args()
    shim = args.shimdir.resolve() / "libcudatrace.so"
    if not shim.is_file():
        ap.error(f"no libcudatrace.so in {args.shimdir}")
    if not shutil.which("valgrind") or not shutil.which("callgrind_annotate"):
        print("callgrind_parts: valgrind (callgrind) is needed", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="ct-parts-") as w:
        work = Path(w)
        exe, libdir = build_bench(work)
        bare = per_pair(exe, libdir, work, args.pairs, {})
        env = {
            "LD_PRELOAD": str(shim),
            "LD_BIND_NOW": "1",
            "CUDATRACE_STACK_DEPTH": str(args.depth),
        }
        traced = per_pair(exe, libdir, work, args.pairs, env)
    diff = sorted(
        ((traced.get(k, 0.0) - bare.get(k, 0.0), k) for k in set(bare) | set(traced)),
        reverse=True,
    )
    print(f"instructions added per async pair by function ({shim}, stack depth {args.depth})")
    for v, k in diff:
        if abs(v) >= args.min:
            print(f"{v:8.1f}  {k}")
    print(f"{sum(v for v, _ in diff):8.1f}  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
