#!/usr/bin/env python3
"""Where the instructions the shim adds to one async alloc+free pair go, by part and by function.

    python3 tools/callgrind_parts.py SHIMDIR [--depth 64] [--pairs 2000] [--min 1] [--rows]

The companion of tools/bench_callgrind.sh (which prints the totals): the same loop
(tools/bench_pairs.c) on the simulated driver, run under callgrind with PAIRS and 2*PAIRS pairs,
bare and with the shim of SHIMDIR preloaded (stacks of --depth frames); every count is the
difference of the two runs over PAIRS (start-up and exit cancel), less the bare run's.

Prints the parts docs/performance.md's "where the instructions go" table sums up:

  call protocol   the wrappers' own code (hooks.def: the real pointer, the fast path's tests,
                  the nesting guard, the arguments, the runtime API's tag), route.h, util.h
                  but the clock
  live counters   live.h, live.c (the address table, the thread's counts and room)
  device lookup   shim.c's current_device / stream_device, and what they call in the driver
                  (the simulated cuCtxGetCurrent, its TLS and its init check)
  clock           clock_gettime and ct_now_ns (util.h)
  record          the raw record (events.h, events.c, rawevent.h, writer)
  stack           the stack's recall (stacks.h, unwind.h, pyframes.h; stacks.c, unwind.c) and
                  the wrapper's frame it starts from

by reading callgrind_annotate's per-line counts of the shim's own sources (the code inlined
into the wrappers is attributed to the line it came from) and its per-function counts of the
rest. --rows prints the function rows as well. x86-64 only (valgrind).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"\s*([\d,]+) (?:\([^)]*\))?\s+(\S.*)$")
SRC = re.compile(r"^-- Auto-annotated source: (.*)$")
LINE = re.compile(r"^-- line (\d+) -+$")
COUNT = re.compile(r"^\s*([\d,]+|\.)\s(.*)$")
PARTS = ("call protocol", "live counters", "device lookup", "clock", "record", "stack")


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


def _annotate(out: Path, auto: bool) -> str:
    return subprocess.run(
        ["callgrind_annotate", f"--auto={'yes' if auto else 'no'}", "--show-percs=no",
         "--threshold=100", f"--include={ROOT}", str(out)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


def _functions(ann: str) -> dict[str, int]:
    """callgrind's exclusive count of every file:function"""
    d: dict[str, int] = {}
    for line in ann.splitlines():
        m = ROW.match(line)
        if not m or ":" not in m.group(2) or "PROGRAM" in m.group(2):
            continue
        key = re.sub(r" \[.*\]$", "", m.group(2))
        d[key] = d.get(key, 0) + int(m.group(1).replace(",", ""))
    return d


def _native(path: str) -> str | None:
    """the file of the shim's sources a path names (callgrind keeps them as compiled), or None"""
    p = Path(path)
    if not p.is_absolute():
        p = ROOT / p
    return str(p) if "native" in p.parts and p.is_file() else None


def _lines(ann: str) -> dict[tuple[str, int], tuple[int, str]]:
    """(file, line) -> (count, its text) of the auto-annotated sources under native/"""
    out: dict[tuple[str, int], tuple[int, str]] = {}
    src, no = "", 0
    for line in ann.splitlines():
        if m := SRC.match(line):
            src, no = _native(m.group(1)) or "", 0
            continue
        if m := LINE.match(line):
            no = int(m.group(1))
            continue
        if line.startswith("---"):  # a separator: no source line follows before a `-- line`
            no = 0
            continue
        if not src or not no:
            continue
        m = COUNT.match(line)
        if not m:
            continue
        if m.group(2).lstrip().startswith("=>"):
            continue  # a call's inclusive cost: its callee is counted where it is
        if m.group(1) != ".":
            out[(src, no)] = (int(m.group(1).replace(",", "")), m.group(2))
        no += 1
    return out


def _functions_of(path: str) -> list[tuple[int, str]]:
    """(first line, name) of each function defined at the left margin of a C file"""
    spans = []
    for i, text in enumerate(Path(path).read_text().splitlines(), 1):
        m = re.match(r"^(?:static |CT_EXPORT |__attribute__\S* )*[\w\s\*\(\)]*?\b(\w+)\(", text)
        if m and not text.startswith((" ", "#", "/", "}", "{")) and not text.endswith(";"):
            spans.append((i, m.group(1)))
    return spans


_SPANS: dict[str, list[tuple[int, str]]] = {}


def _function_at(path: str, no: int) -> str:
    if path not in _SPANS:
        _SPANS[path] = _functions_of(path)
    name = ""
    for first, fn in _SPANS[path]:
        if first > no:
            break
        name = fn
    return name


def part_of_line(path: str, no: int, text: str) -> str:
    base = os.path.basename(path)
    if base in ("live.h", "live.c"):
        return "live counters"
    if base in ("events.h", "events.c", "rawevent.h", "writer.h", "writer.c", "writer_stats.h"):
        return "record"
    if base in ("stacks.h", "stacks.c", "unwind.h", "unwind.c", "pyframes.h", "pyframes.c"):
        return "stack"
    if base == "util.h" and _function_at(path, no) == "ct_now_ns":
        return "clock"
    if base == "shim.c":
        fn = _function_at(path, no)
        if fn.startswith(("current_device", "stream_device", "context_device", "device_syms")):
            return "device lookup"
        if fn == "fast_event" and (
            "CT_CALLER" in text
            or "ct_stack_capture" in text
            or "FAST_STACKS" in text
            or "caller" in text
        ):
            return "stack"
    return "call protocol"


def part_of_function(key: str) -> str | None:
    """the part of a function outside the shim's sources; None: the driver's own work"""
    fn = key.rsplit(":", 1)[-1]
    if "clock_gettime" in fn:
        return "clock"
    if fn.startswith(("cuCtxGetCurrent", "current_ctx", "__tls_get_addr", "pthread_once")):
        return "device lookup"  # what the shim's lookup costs the (simulated) driver
    return None


def run(exe: Path, libdir: Path, work: Path, n: int, env: dict) -> str:
    """callgrind's output file of one run of n pairs"""
    out = work / f"cg.{n}.{len(env)}"
    trace = work / "trace"
    shutil.rmtree(trace, ignore_errors=True)
    trace.mkdir()
    e = dict(os.environ, LD_LIBRARY_PATH=str(libdir), CUDATRACE_DIR=str(trace), **env)
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", str(exe), str(n)],
        env=e, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return str(out)


def per_pair(exe: Path, libdir: Path, work: Path, pairs: int, env: dict):
    """(functions, native source lines): counts per pair"""
    a, b = run(exe, libdir, work, pairs, env), run(exe, libdir, work, 2 * pairs, env)
    fa, fb = _functions(_annotate(Path(a), False)), _functions(_annotate(Path(b), False))
    funcs = {k: (fb.get(k, 0) - fa.get(k, 0)) / pairs for k in set(fa) | set(fb)}
    la, lb = _lines(_annotate(Path(a), True)), _lines(_annotate(Path(b), True))
    lines = {
        k: ((lb.get(k, (0, ""))[0] - la.get(k, (0, ""))[0]) / pairs, (lb.get(k) or la[k])[1])
        for k in set(la) | set(lb)
    }
    return funcs, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shimdir", type=Path, help="folder holding libcudatrace.so")
    ap.add_argument("--depth", type=int, default=64, help="CUDATRACE_STACK_DEPTH (default 64)")
    ap.add_argument("--pairs", type=int, default=2000, help="pairs of the shorter run (2000)")
    ap.add_argument("--min", type=float, default=1.0, help="rows below this are left out (1)")
    ap.add_argument("--rows", action="store_true", help="print the function rows as well")
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
        bare, _ = per_pair(exe, libdir, work, args.pairs, {})
        env = {
            "LD_PRELOAD": str(shim),
            "LD_BIND_NOW": "1",
            "CUDATRACE_STACK_DEPTH": str(args.depth),
        }
        traced, lines = per_pair(exe, libdir, work, args.pairs, env)
    diff = {k: traced.get(k, 0.0) - bare.get(k, 0.0) for k in set(bare) | set(traced)}
    parts: dict[str, float] = defaultdict(float)
    for (path, no), (v, text) in lines.items():
        parts[part_of_line(path, no, text)] += v
    other = 0.0
    for k, v in diff.items():
        if _native(k.rsplit(":", 1)[0]):
            continue  # counted by its lines
        p = part_of_function(k)
        if p:
            parts[p] += v
        else:
            other += v
    total = sum(diff.values())
    print(f"instructions added per async pair by part ({shim}, stack depth {args.depth})")
    for p in PARTS:
        print(f"{parts[p]:8.1f}  {p}")
    print(f"{other:8.1f}  the driver's and libc's own work (differences between runs)")
    print(f"{total:8.1f}  total")
    if args.rows:
        print("\nby function (the code inlined into a wrapper under the file it came from)")
        for k, v in sorted(diff.items(), key=lambda kv: -kv[1]):
            if abs(v) >= args.min:
                print(f"{v:8.1f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
