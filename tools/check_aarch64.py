"""Cross-check the shim on aarch64 (the Jetson's architecture) without an aarch64 machine.

Builds the preload library, the simulated driver and the route programs with
aarch64-linux-gnu-gcc, runs them under qemu-aarch64 with the shim preloaded, and checks each
trace the way tests/integration/test_routes.py does: one event per printed call, same API, size, pointer and
result, stacks present and landing in the calling function. The trace is read by the (x86-64)
Python reader: the format is the same on both architectures.

    apt-get install gcc-aarch64-linux-gnu qemu-user      # once
    python3 tools/check_aarch64.py
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))                  # the tests' support package
sys.path.insert(0, str(REPO / "tests" / "integration"))  # test_routes' comparison

CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"


def main() -> int:
    for tool in (CC, QEMU):
        if not shutil.which(tool):
            print("missing %s: apt-get install gcc-aarch64-linux-gnu qemu-user" % tool)
            return 2
    from support import simbuild
    from cudatrace.analyze.trace import read_dir
    from test_routes import OPS, expected_ops, traced_ops  # the tests' own comparison

    work = Path(tempfile.mkdtemp(prefix="ct-aarch64-"))
    shim = work / "shim"
    subprocess.run(["make", "-s", "-C", str(REPO / "native"), "OUT=%s" % shim, "CC=%s" % CC], check=True)
    os.environ["CC"] = CC
    paths = simbuild.build_all(work / "sim")
    failures = 0
    cases = [("route_link", []), ("route_link", ["--ptsz"]), ("route_dlsym", []), ("route_gpa", []),
             ("route_gpa", ["--ptsz"]), ("threads", ["4", "1000", "4096"])]
    for prog, args in cases:
        out = work / ("trace-%s-%s" % (prog, "-".join(args) or "plain"))
        out.mkdir()
        env = ["-E", "LD_LIBRARY_PATH=%s" % paths["libdir"], "-E", "CUDATRACE_DIR=%s" % out,
               "-E", "LD_PRELOAD=%s" % (shim / "libcudatrace.so"), "-E", "LD_BIND_NOW=1"]
        r = subprocess.run([QEMU, "-L", SYSROOT, *env, str(paths[prog]), *args],
                           capture_output=True, text=True, timeout=300)
        name = " ".join([prog] + args)
        if r.returncode != 0:
            print("FAIL %s: exit %d\n%s" % (name, r.returncode, r.stderr[-2000:]))
            failures += 1
            continue
        t = read_dir(out).traces[0]
        if prog == "threads":
            n = sum(1 for e in t.events if e[t_op()] == OPS_C("CT_OP_ALLOC"))
            ok = n == 4000 and t.complete and t.arch == "aarch64"
            print("%s %s: %d allocations traced (want 4000), arch %s" % ("ok  " if ok else "FAIL",
                                                                       name, n, t.arch))
            failures += not ok
            continue
        want = [w for w in expected_ops(r.stdout) if w[1] not in ("cuMemAlloc", "cuMemFree")]
        _, got = traced_ops(out)
        bad = [(w, (op, api)) for w, (op, api, e) in zip(want, got)
               if op != w[0] or api != w[1].replace("_ptsz", "")
               or (w[0] != "meminfo" and (e["addr"] != w[3] or e["result"] != w[4]))]
        stacks = sum(1 for _, _, e in got if e["stack"])
        ok = len(want) == len(got) and not bad and stacks == len(got)
        print("%s %s: %d calls printed, %d events traced, %d with stacks, %d mismatches" % (
            "ok  " if ok else "FAIL", name, len(want), len(got), stacks, len(bad)))
        failures += not ok
    print("traces in %s" % work)
    return 1 if failures else 0


def t_op() -> int:
    from cudatrace.analyze.trace import event_fields
    return event_fields().index("op")


def OPS_C(name: str) -> int:
    from cudatrace.analyze.trace import C
    return C()[name]


if __name__ == "__main__":
    sys.exit(main())
