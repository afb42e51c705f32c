"""Build the simulated CUDA driver, simulated NVML and the test programs (no GPU, no CUDA).

    build_all(outdir) -> {name: Path | None}
    sim_env(libdir, **opts) -> {env var: value}

Layout of outdir:
    lib/libcuda.so.1  (+ libcuda.so symlink)            simulated driver  (sim/libcuda_sim.c)
    lib/libnvidia-ml.so.1  (+ libnvidia-ml.so symlink)   simulated NVML    (sim/libnvml_sim.c)
    (both built by cudatrace.simdriver, the one build rule of the simulator)
    preload/libnext.so, preload/libinterpose.so          preload helpers   (tests/progs/lib*.c)
    bin/<program>                                        test programs     (tests/progs/<program>.c)

Names in the dict: "libdir" (the lib/ folder: put it in LD_LIBRARY_PATH), "libcuda", "libnvml",
"libnext", "libinterpose", and one per program (PROGRAMS). "static_prog" is None when the C
library has no static version (cc -static fails).

Programs are built with -O0 -g -fno-omit-frame-pointer -rdynamic (their allocating functions are
named, non-inlined and exported, so stack addresses resolve to names), linked against the simulator
with -L<libdir> -lcuda where they call the driver directly, and never with an rpath: a process
finds the simulator (and a tracer the same one) through LD_LIBRARY_PATH alone.

A target is rebuilt only when it is missing, older than a source it depends on, or was built by
another command line. Builds into one outdir are serialized with a lock file.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cudatrace import simdriver

from .paths import PROGS, REPO, SHIM, SIM, TESTS  # noqa: F401  (REPO, TESTS: for callers)

COMMON_CFLAGS = [
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-D_GNU_SOURCE",
    "-pthread",
    f"-I{SHIM}",
    f"-I{SIM}",
    f"-I{PROGS}",
]
LIB_CFLAGS = ["-O1", "-g", "-fPIC", "-shared", "-fno-omit-frame-pointer"]
PROG_CFLAGS = ["-O0", "-g", "-fno-omit-frame-pointer", "-rdynamic"]

# program -> how it is linked: "cuda" (-lcuda), "plain", "static"
PROGRAMS: dict[str, str] = {
    "route_link": "cuda",
    "route_dlsym": "plain",
    "route_gpa": "plain",
    "threads": "cuda",
    "hold": "cuda",
    "forkexec": "cuda",
    "exitcode": "plain",
    "dlsym_next": "plain",
    "static_prog": "static",
    "meminfo": "cuda",
    "budget_hammer": "cuda",
    "simstat": "cuda",
    "closefds": "cuda",
    "churn": "cuda",
    "leakers": "cuda",
    "steps": "cuda",
    "bypass": "cuda",
    "preload_probe": "plain",
}

# Environment of the simulator: sim_env() keyword -> variable
SIM_OPTIONS: dict[str, str] = {
    "state": "CUDASIM_STATE",  # shared device state file (unset: per process)
    "devices": "CUDASIM_DEVICES",  # 1..8
    "total_bytes": "CUDASIM_TOTAL_BYTES",  # bytes per device; a list gives one per device
    "driver_version": "CUDASIM_DRIVER_VERSION",  # cuDriverGetVersion, cuGetProcAddress limit
    "integrated": "CUDASIM_INTEGRATED",  # 1: integrated device (host pinned memory counts)
    "fail_nth": "CUDASIM_FAIL_NTH",  # n-th allocation call fails with OUT_OF_MEMORY
    "calls": "CUDASIM_CALLS",  # append "pid symbol count" lines at exit
    "ctx_bytes": "CUDASIM_CTX_BYTES",  # hidden per-process context cost per device
    "call_delay_us": "CUDASIM_CALL_DELAY_US",  # allocations wait before charging, frees after
    "strict_context": "CUDASIM_STRICT_CONTEXT",  # 1: no implicit context after cuInit
    "meminfo": "CUDASIM_MEMINFO",  # integrated: a /proc/meminfo-like file for cuMemGetInfo
    "backed": "CUDASIM_BACKED",  # 1: device memory is real touched memory (RSS, PSS)
    "host_proc": "CUDASIM_HOST_PROC",  # the host's /proc in a container: host pids, as NVML's
    "nvml_procs_ms": "CUDASIM_NVML_PROCS_MS",  # a process's first NVML process list: this long
    "nvml_procs": "CUDASIM_NVML_PROCS",  # per-process memory: bytes, na (Thor), mig, unsupported
}


class BuildError(RuntimeError):
    pass


def _headers() -> list[Path]:
    return [
        SHIM / "cuda_abi.h",
        SHIM / "hooks.def",
        SIM / "sim_state.h",
        *sorted(PROGS.glob("*.h")),
    ]


def _warn(msg: str) -> None:
    # warnings are bugs in these sources: keep them visible
    print(f"simbuild: {msg}")


def _compile(
    out: Path, cmd_tail: list[str], deps: list[Path], *, allow_fail: bool = False
) -> Path | None:
    try:
        return simdriver.compile_if_stale(out, cmd_tail, deps, allow_fail=allow_fail, warn=_warn)
    except simdriver.BuildError as e:
        raise BuildError(str(e)) from None


def build_all(outdir: Path, programs: Iterable[str] | None = None) -> dict[str, Path | None]:
    """Compile the simulated libraries and every program (or those named) into outdir; return
    name -> path."""
    outdir = Path(outdir).resolve()
    libdir, bindir, predir = outdir / "lib", outdir / "bin", outdir / "preload"
    for d in (libdir, bindir, predir):
        d.mkdir(parents=True, exist_ok=True)
    headers = _headers()
    result: dict[str, Path | None] = {"libdir": libdir}
    with open(outdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # the libraries first: programs link against libcuda.so
        try:
            result.update(
                (k, v) for k, v in simdriver.build(libdir, warn=_warn).items() if k != "libdir"
            )
        except simdriver.BuildError as e:
            raise BuildError(str(e)) from None
        for name in ("libnext", "libinterpose"):
            src = PROGS / f"{name}.c"
            out = predir / f"{name}.so"
            _compile(
                out, [*COMMON_CFLAGS, *LIB_CFLAGS, "-Wl,--no-undefined", str(src), "-ldl"], [src]
            )
            result[name] = out

        def build_prog(name: str) -> tuple[str, Path | None]:
            kind = PROGRAMS[name]
            src = PROGS / f"{name}.c"
            out = bindir / name
            if kind == "static":
                return name, _compile(
                    out, ["-O0", "-g", "-static", str(src)], [src], allow_fail=True
                )
            tail = [*COMMON_CFLAGS, *PROG_CFLAGS, str(src)]
            if kind == "cuda":
                tail += [f"-L{libdir}", "-lcuda"]
            tail += ["-ldl"]
            return name, _compile(out, tail, [src, *headers])

        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2)) as ex:
            for name, path in ex.map(build_prog, PROGRAMS if programs is None else programs):
                result[name] = path
    return result


def sim_env(libdir: Path, **opts: object) -> dict[str, str]:
    """The variables a process needs to run on the simulator: LD_LIBRARY_PATH=libdir plus the
    simulator options given (SIM_OPTIONS keywords; None leaves one unset, True/False are 1/0, a
    list or tuple is joined with commas)."""
    env = {"LD_LIBRARY_PATH": str(libdir)}
    for key, value in opts.items():
        if key not in SIM_OPTIONS:
            raise TypeError(f"unknown simulator option {key!r} (known: {', '.join(SIM_OPTIONS)})")
        if value is None:
            continue
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        env[SIM_OPTIONS[key]] = str(value)
    return env


# ---- reading what the programs and the simulator write ---------------------------------------

OPS = {"alloc", "free", "map", "unmap", "import", "unimport", "meminfo"}


@dataclass(frozen=True)
class Op:
    """One operation line of a test program: `op api size ptr result` (cudasim_api.h).
    For meminfo, size is the total and ptr the free bytes; None stands for '-'."""

    op: str
    api: str
    size: int | None
    ptr: int | None
    result: int


def _num(field: str) -> int | None:
    if field == "-":
        return None
    return int(field, 0)


def parse_ops(text: str) -> list[Op]:
    """The operation lines of a program's stdout, in order (notes and status lines skipped)."""
    ops = []
    for line in text.splitlines():
        f = line.split()
        if len(f) == 5 and f[0] in OPS:
            ops.append(Op(f[0], f[1], _num(f[2]), _num(f[3]), int(f[4])))
    return ops


def parse_resolves(text: str) -> list[dict]:
    """route_gpa / meminfo lookup lines: resolve BASE VERSION FLAGS RESULT STATUS SYMBOL LIBRARY."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) == 8 and f[0] == "resolve":
            out.append(
                {
                    "base": f[1],
                    "version": int(f[2]),
                    "flags": int(f[3]),
                    "result": int(f[4]),
                    "status": None if f[5] == "-" else int(f[5]),
                    "symbol": None if f[6] == "-" else f[6],
                    "library": None if f[7] == "-" else f[7],
                }
            )
    return out


def parse_calls(path: Path) -> dict[int, dict[str, int]]:
    """CUDASIM_CALLS file -> {pid: {symbol: count}} (counts of one pid summed over its images)."""
    calls: dict[int, dict[str, int]] = {}
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return calls
    for line in text.splitlines():
        f = line.split()
        if len(f) == 3:
            per = calls.setdefault(int(f[0]), {})
            per[f[1]] = per.get(f[1], 0) + int(f[2])
    return calls


_DEV_RE = re.compile(r"dev (\d+) total (\d+) used (\d+) hwm (\d+) free (\d+)")
_PID_RE = re.compile(r"pid (\d+) (\d+) used (\d+) hwm (\d+)")


def parse_simstat(text: str) -> list[dict]:
    """simstat output -> [{dev, total, used, hwm, free, pids: {pid: {used, hwm}}}] per device."""
    devs: list[dict] = []
    for line in text.splitlines():
        m = _DEV_RE.fullmatch(line.strip())
        if m:
            d, total, used, hwm, free = map(int, m.groups())
            devs.append(
                {"dev": d, "total": total, "used": used, "hwm": hwm, "free": free, "pids": {}}
            )
            continue
        m = _PID_RE.fullmatch(line.strip())
        if m:
            d, pid, used, hwm = map(int, m.groups())
            devs[d]["pids"][pid] = {"used": used, "hwm": hwm}
    return devs
