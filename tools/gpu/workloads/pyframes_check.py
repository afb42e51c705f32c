#!/usr/bin/env python3
"""GPU proof of Python frames (issue 12): for PyTorch (default allocator and expandable
segments), CuPy, JAX and plain ctypes (runs on the simulated driver too), trace a small script and check that the top site of
`cudatrace report --json` names the script's line that caused the allocation.

    python3 tools/gpu/workloads/pyframes_check.py [--out DIR] [--only ctypes,torch,torch_expandable,cupy,jax]

Each case writes its script to DIR/pf_<case>.py (the line expected on top carries `# EXPECTED`),
runs `python3 -m cudatrace run -o DIR/<case>.trace -- python3 DIR/<case>.py`, then
`cudatrace report --json` in the default (hybrid) view and with --python-only, and prints one
JSON line per case and view:
  {"case", "view", "python": {version, status, counts}, "top_label", "top_bytes",
   "expected": "file:line", "innermost_python": "file:line", "script_frame": "file:line",
   "top_is_expected": bool (the top site's innermost Python frame is the expected line),
   "script_line_in_top": bool (the expected line is the first frame of the script in the top
   site's stack: a framework's Python layers above it are what allocator-layer folding removes),
   "site_is_expected": bool (the top site is headed by the expected line),
   "python_stack": the top site's whole Python stack, innermost first (--python-only view row)}
A case whose framework is not installed prints {"case", "skipped": reason}. Exit status 0 when
every case that ran has site_is_expected in both views.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

TORCH = """
import torch

def build_kv_cache(layers, nbytes):
    return [torch.empty(nbytes, dtype=torch.uint8, device="cuda") for _ in range(layers)]  # EXPECTED

def small_work():
    return torch.ones(1000, device="cuda")

torch.cuda.init()
kv = build_kv_cache(4, 256 << 20)
x = small_work()
torch.cuda.synchronize()
"""

CUPY = """
import cupy

def build_kv_cache(layers, nbytes):
    return [cupy.empty(nbytes, dtype=cupy.uint8) for _ in range(layers)]  # EXPECTED

kv = build_kv_cache(4, 256 << 20)
cupy.cuda.Device(0).synchronize()
"""

JAX = """
import jax
import jax.numpy as jnp

def first_array():
    return jnp.arange(1000)  # EXPECTED (the backend starts here and preallocates its pool)

x = first_array()
x.block_until_ready()
"""

CTYPES = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
dev = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)

def build_kv_cache(layers, nbytes):
    out = []
    for _ in range(layers):
        p = ctypes.c_uint64()
        assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)) == 0  # EXPECTED
        out.append(p)
    return out

kv = build_kv_cache(4, 256 << 20)
"""

CASES = {
    "ctypes": ("ctypes", CTYPES, {}),
    "torch": ("torch", TORCH, {}),
    "torch_expandable": ("torch", TORCH, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    "cupy": ("cupy", CUPY, {}),
    "jax": ("jax", JAX, {}),
}


def where(f: dict | None) -> str | None:
    if not f:
        return None
    return "{}:{}".format(os.path.basename(f.get("file") or f.get("module") or "?"), f.get("line"))


def check(case: str, out: Path) -> list[dict]:
    mod, src, extra = CASES[case]
    probe = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True, text=True)
    if probe.returncode != 0:
        return [
            {
                "case": case,
                "skipped": f"{mod} not importable: {probe.stderr.strip()[-200:]}",
            }
        ]
    script = out / (f"pf_{case}.py")  # never the name of the module it imports
    script.write_text(src)
    line = next(i for i, l in enumerate(src.splitlines(), 1) if "# EXPECTED" in l)
    expected = "%s:%d" % (script.name, line)
    trace = out / (case + ".trace")
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "--force",
            "-o",
            str(trace),
            "--",
            sys.executable,
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        return [{"case": case, "error": "run failed (%d): %s" % (r.returncode, r.stderr[-2000:])}]
    rows = []
    # the whole Python stack of the top site, for the record (a site's context lists 6 frames)
    deep = subprocess.run(
        [sys.executable, "-m", "cudatrace", "report", "--json", "--python-only", "--no-fold"]
        + ["--depth", "64", str(trace)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    stack = None
    if deep.returncode == 0:
        sites = json.loads(deep.stdout)["sites"]
        if sites:
            stack = [
                "%s %s" % (f.get("function"), where(f)) for f in sites[0]["context"] if f["python"]
            ]
    for view, opts in (("hybrid", []), ("python", ["--python-only"])):
        rep = subprocess.run(
            [
                sys.executable,
                "-m",
                "cudatrace",
                "report",
                "--json",
                "--depth",
                "1",
                *opts,
                str(trace),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if rep.returncode != 0:
            rows.append({"case": case, "view": view, "error": rep.stderr[-2000:]})
            continue
        j = json.loads(rep.stdout)
        top = j["sites"][0] if j["sites"] else None
        ctx = (top or {}).get("context") or []
        pyf = [f for f in ctx if f.get("python")]
        mine = [f for f in pyf if os.path.basename(f.get("file") or "") == script.name]
        rows.append(
            {
                "case": case,
                "view": view,
                "python": j.get("python"),
                "top_label": top and top["label"],
                "top_bytes": top and top["bytes"],
                "top_api": top and top["api"],
                "expected": expected,
                "innermost_python": where(pyf[0] if pyf else None),
                "script_frame": where(mine[0] if mine else None),
                "top_is_expected": bool(pyf) and where(pyf[0]) == expected,
                "script_line_in_top": bool(mine) and where(mine[0]) == expected,
                "site_is_expected": bool(top and top.get("frames"))
                and where(top["frames"][0]) == expected,
                "python_stack": stack if view == "python" else None,
            }
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--only", default=",".join(CASES))
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="pyframes_check-"))
    out.mkdir(parents=True, exist_ok=True)
    ok = True
    for case in a.only.split(","):
        for row in check(case, out):
            print(json.dumps(row), flush=True)
            if row.get("error") or (row.get("view") and not row.get("site_is_expected")):
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
