#!/usr/bin/env python3
"""The live counters and the context record on a real GPU (what the simulated driver stands in
for in tests/integration/test_api.py and test_sweep_harden.py):

    python3 tools/gpu/live_context_check.py [OUTDIR]     (repository root; default /tmp/ct-live)

1. VMM: cuMemCreate'd memory mapped twice, released while mapped (the CUDA samples' order):
   cudatrace.stats().live keeps it until the last cuMemUnmap, as the driver does (NVML's
   per-process figure is printed beside each step); a block's own figures ignore it.
2. The context record: a short program run with CUDATRACE_RECORD_CONTEXTS=1 records
   INFO context.0 (the figure a budget counts: NVML's for the process less its allocations);
   it must be a context's size (100 MiB .. 4 GiB) and at most NVML's figure for the process.
3. sweep --predict over runs of well under the sampler's 100 ms advises a budget that
   includes the context, and the program at the predicted value is not denied under it.
Needs a CUDA GPU with NVML, python3 with click, cffi, pyelftools. Prints PASS/FAIL lines;
exit status: the number of FAILs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ct-live")
ENV = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
MiB = 1 << 20
fails = 0


def verdict(ok: bool, what: str) -> None:
    global fails
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    fails += not ok


PRELUDE = r"""
import ctypes, json, os, sys
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
"""

VMM = (
    PRELUDE
    + r"""
import cudatrace
nvml = ctypes.CDLL("libnvidia-ml.so.1"); nvml.nvmlInit_v2()
class Info(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]
def nvml_mine():
    h = ctypes.c_void_p(); nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
    n = ctypes.c_uint(256); info = (Info * 256)()
    nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), info)
    return next((i.used for i in info[: n.value] if i.pid == os.getpid()), None)
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handleTypes", ctypes.c_int), ("loctype", ctypes.c_int),
                ("id", ctypes.c_int), ("meta", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]
prop = Prop(1, 0, 1, 0)
g = ctypes.c_size_t(); assert cuda.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), 0) == 0
size = max(g.value, 64 << 20) // g.value * g.value
h = ctypes.c_uint64()
assert cuda.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0)) == 0
va = ctypes.c_uint64()
assert cuda.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(2 * size), ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_ulonglong(0)) == 0
for i in range(2):
    assert cuda.cuMemMap(ctypes.c_uint64(va.value + i * size), ctypes.c_size_t(size), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0)) == 0
steps = [("mapped", cudatrace.stats().live, nvml_mine())]
with cudatrace.track() as t:
    assert cuda.cuMemRelease(h) == 0
    steps.append(("released", cudatrace.stats().live, nvml_mine()))
    assert cuda.cuMemUnmap(ctypes.c_uint64(va.value), ctypes.c_size_t(size)) == 0
    steps.append(("one unmapped", cudatrace.stats().live, nvml_mine()))
    assert cuda.cuMemUnmap(ctypes.c_uint64(va.value + size), ctypes.c_size_t(size)) == 0
    steps.append(("both unmapped", cudatrace.stats().live, nvml_mine()))
print(json.dumps({"size": size, "steps": steps, "block": [t.peak, t.left]}))
"""
)

SHORT = (
    PRELUDE
    + r"""
from cudatrace.units import parse_size
n = parse_size(sys.argv[1])
p = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
assert cuda.cuMemFree_v2(p) == 0
"""
)


def cudatrace(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cudatrace", *map(str, args)],
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


def check_vmm() -> None:
    prog = OUT / "vmm.py"
    prog.write_text(textwrap.dedent(VMM))
    r = cudatrace("run", "-q", "-o", OUT / "vmm", "--force", "--", sys.executable, prog)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        verdict(False, f"vmm program failed: {r.stdout}{r.stderr}")
        return
    got = json.loads(lines[-1])
    size = got["size"]
    for name, live, nv in got["steps"]:
        print(
            f"  {name:>14}: live counters {live / MiB:.0f} MiB, NVML for the process "
            f"{(nv or 0) / MiB:.0f} MiB"
        )
    lives = [live for _, live, _ in got["steps"]]
    verdict(
        lives == [size, size, size, 0],
        f"VMM: released while mapped stays counted until the last unmap ({lives})",
    )
    nv = [x for _, _, x in got["steps"]]
    if None not in nv:
        verdict(
            nv[2] - nv[3] >= size // 2,
            "NVML agrees: the memory went at the last unmap, not at the release",
        )
    verdict(got["block"] == [0, 0], f"VMM: the block's own figures are 0 ({got['block']})")


def check_context_record() -> None:
    prog = OUT / "short.py"
    prog.write_text(textwrap.dedent(SHORT))
    env = dict(ENV, CUDATRACE_RECORD_CONTEXTS="1")
    r = cudatrace("run", "-q", "-o", OUT / "short", "--force", "--", sys.executable, prog,
                  64 * MiB, env=env)  # fmt: skip
    sys.path.insert(0, str(ROOT))
    from cudatrace.analyze.documents.analysis import Analysis

    ctxs = Analysis(OUT / "short").budget_contexts() if r.returncode == 0 else {}
    c = ctxs.get(0)
    print(f"  recorded context on device 0: {c and c / MiB:.0f} MiB" if c else "  none recorded")
    verdict(
        c is not None and 100 * MiB <= c <= 4096 * MiB,
        f"context record: INFO context.0 is a context's size ({c})",
    )


def check_sweep() -> None:
    prog = OUT / "short.py"
    sw = OUT / "sweep"
    shutil.rmtree(sw, ignore_errors=True)
    r = cudatrace("sweep", "--values", "64MiB,128MiB,192MiB", "--predict", "256MiB", "-o", sw,
                  "--json", "--", sys.executable, prog, "{}")  # fmt: skip
    if r.returncode != 0:
        verdict(False, f"sweep failed: {r.stderr}")
        return
    doc = json.loads(r.stdout)
    secs = [run["seconds"] for run in doc["runs"]]
    b = (doc.get("prediction") or {}).get("budget") or {}
    print(f"  runs took {secs} s; advised {b.get('spec')} with context {b.get('context_bytes')}")
    verdict(
        (b.get("context_bytes") or 0) >= 100 * MiB,
        "sweep --predict: the advice includes the CUDA context measured by the shim",
    )
    if not b.get("spec"):
        return
    run = cudatrace("run", "-q", "-o", OUT / "at_predicted", "--force", "--budget", b["spec"],
                    "--", sys.executable, prog, 256 * MiB)  # fmt: skip
    verdict(
        run.returncode == 0 and "budget exceeded" not in run.stderr,
        f"the program at the predicted value runs under --budget {b['spec']}",
    )


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "OUT=../cudatrace/_native"],
                   check=True)  # fmt: skip
    check_vmm()
    check_context_record()
    check_sweep()
    print(f"live_context_check: {fails} FAIL(s)")
    return fails


if __name__ == "__main__":
    sys.exit(main())
