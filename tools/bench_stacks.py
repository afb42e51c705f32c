"""Stack-cache figures on x86-64 and aarch64 (under qemu-user): how many events take a full unwind,
whether the cached stacks equal full unwinds, and instructions per event.

    python3 tools/bench_stacks.py [--pairs 10000] [--depth 10] [--json OUT]

Builds (natively and with aarch64-linux-gnu-gcc) the preload library, the simulated driver and a
program that makes N cuMemAllocAsync + cuMemFreeAsync pairs from one call site, DEPTH frames
below main. Then, per architecture:

1. cache: N pairs with CUDATRACE_STACK_VERIFY=1 (every event also unwound by libgcc and
   compared): events, full unwinds, cache hits, compared, mismatches (from the trace header).
2. instructions per event, counted by qemu-user itself (-singlestep -d exec,nochain logs one
   line per executed guest instruction; the same measure on both architectures, deterministic
   up to the environment's length): the count for 1200 pairs minus the count for 200 pairs,
   divided by the 2000 events in between, for the program alone, with the shim and
   --stack-depth 0, and with the shim and 64-frame stacks. On x86-64 also valgrind
   (callgrind's instruction count, same difference) when valgrind is installed, as a check of
   the qemu figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

PAIRS_C = r"""
#include "cudasim_api.h"
__attribute__((noinline)) void pair(void)
{
    CUdeviceptr p = 0;
    if (cuMemAllocAsync(&p, 1 << 20, 0) == CUDA_SUCCESS)
        cuMemFreeAsync(p, 0);
}
__attribute__((noinline)) void nest(int d)
{
    volatile int keep = d;
    if (d > 0)
        nest(d - 1);
    else
        pair();
    (void)keep;
}
static long g_n;
__attribute__((noinline)) void loop(int d)
{
    for (long i = 0; i < g_n; i++)
        nest(d);
}
int main(int argc, char **argv)
{
    g_n = argc > 1 ? atol(argv[1]) : 1000;
    int depth = argc > 2 ? atoi(argv[2]) : 10;
    if (cuInit(0) != CUDA_SUCCESS) return 1;
    loop(depth);
    return 0;
}
"""

SYSROOT = "/usr/aarch64-linux-gnu"


def build(arch: str, work: Path) -> dict:
    from support import simbuild

    cc = "cc" if arch == "x86_64" else "aarch64-linux-gnu-gcc"
    os.environ["CC"] = cc
    paths = simbuild.build_all(work / "sim")
    shim = subprocess.run(
        [str(REPO / "tools" / "cross-build-shim"), cc, str(work / "shim")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    src = work / "pairs.c"
    src.write_text(PAIRS_C)
    exe = work / "pairs"
    subprocess.run(
        [
            cc,
            "-O2",
            "-g",
            "-fno-omit-frame-pointer",
            f"-I{simbuild.SHIM}",
            f"-I{simbuild.PROGS}",
            "-o",
            str(exe),
            str(src),
            "-L{}".format(paths["libdir"]),
            "-lcuda",
        ],
        check=True,
    )
    return {"cc": cc, "shim": shim, "exe": exe, "libdir": paths["libdir"]}


def qemu_for(arch: str) -> list:
    return ["qemu-x86_64"] if arch == "x86_64" else ["qemu-aarch64", "-L", SYSROOT]


def run_env(b: dict, trace_dir: Path | None, depth: int | None, verify: bool = False) -> dict:
    env = {"LD_LIBRARY_PATH": str(b["libdir"])}
    if trace_dir is not None:
        env.update(
            {
                "LD_PRELOAD": b["shim"],
                "CUDATRACE_DIR": str(trace_dir),
                "CUDATRACE_STACK_DEPTH": str(depth),
            }
        )
        if verify:
            env["CUDATRACE_STACK_VERIFY"] = "1"
    return env


def cache_figures(arch: str, b: dict, work: Path, pairs: int, depth: int) -> dict:
    from cudatrace.analyze.read.trace import read_dir

    d = work / "verify"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    env = run_env(b, d, 64, verify=True)
    if arch == "x86_64":
        subprocess.run(
            [str(b["exe"]), str(pairs), str(depth)], env=dict(os.environ, **env), check=True
        )
    else:
        cmd = qemu_for(arch) + [a for k, v in env.items() for a in ("-E", f"{k}={v}")]
        subprocess.run(cmd + [str(b["exe"]), str(pairs), str(depth)], check=True)
    t = read_dir(d).traces[0]
    return {
        "events": t.n_events,
        "full_unwinds": t.stack_unwinds_full,
        "cache_hits": t.stack_cache_hits,
        "compared": t.stack_verified,
        "mismatches": t.stack_mismatches,
        "full_fraction": t.stack_unwinds_full / max(1, t.n_events),
    }


def qemu_insns(arch: str, b: dict, work: Path, n: int, depth: int, config: str) -> int:
    d = work / ("q-%s-%d" % (config, n))
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    env = run_env(b, None if config == "plain" else d, 0 if config == "nostack" else 64)
    cmd = qemu_for(arch) + ["-singlestep", "-d", "exec,nochain", "-D", "/dev/stdout"]
    cmd += [a for k, v in env.items() for a in ("-E", f"{k}={v}")]
    p = subprocess.Popen(cmd + [str(b["exe"]), str(n), str(depth)], stdout=subprocess.PIPE)
    count = 0
    for chunk in iter(lambda: p.stdout.read(1 << 20), b""):
        count += chunk.count(b"\nTrace ")
    if p.wait() != 0:
        raise RuntimeError(f"{cmd} failed")
    return count


def callgrind_insns(b: dict, work: Path, n: int, depth: int, config: str) -> int:
    d = work / ("v-%s-%d" % (config, n))
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    env = dict(
        os.environ, **run_env(b, None if config == "plain" else d, 0 if config == "nostack" else 64)
    )
    r = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            str(b["exe"]),
            str(n),
            str(depth),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    m = re.search(r"Collected : (\d+)", r.stderr)
    if r.returncode != 0 or not m:
        raise RuntimeError(r.stderr[-2000:])
    return int(m.group(1))


def per_event(fn, lo: int = 200, hi: int = 1200) -> float:
    return (fn(hi) - fn(lo)) / (2.0 * (hi - lo))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10000)
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {"pairs": args.pairs, "depth": args.depth, "arch": {}}
    work = Path(tempfile.mkdtemp(prefix="ct-bench-stacks-"))
    for arch in ("x86_64", "aarch64"):
        w = work / arch
        w.mkdir()
        b = build(arch, w)
        r = {"cache": cache_figures(arch, b, w, args.pairs, args.depth)}
        q = {
            c: per_event(lambda n, c=c: qemu_insns(arch, b, w, n, args.depth, c))
            for c in ("plain", "nostack", "stacks")
        }
        r["qemu_insns_per_event"] = q
        if arch == "x86_64" and shutil.which("valgrind"):
            r["callgrind_insns_per_event"] = {
                c: per_event(lambda n, c=c: callgrind_insns(b, w, n, args.depth, c))
                for c in ("plain", "nostack", "stacks")
            }
        res["arch"][arch] = r
        print(arch, json.dumps(r, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
