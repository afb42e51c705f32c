"""The GPU suite: cudatrace on a real NVIDIA GPU (docs/gpu-suite.md says how to run it).

Every test is marked `gpu` and skipped, with the reason, where there is no GPU (no /dev/nvidia0
or no working nvidia-smi), no nvcc (the CUDA programs), or no torch / jax / cupy (their
workloads). The CUDA programs of tools/gpu are built once per session into a temporary
directory; each case runs under `python3 -m cudatrace run -o DIR -q [...] -- CMD`.

What is checked is what can be known exactly: every allocation and free a program printed
(tools/gpu/gpu_common.h) appears as exactly one trace event of the expected driver API, with the
same size and pointer; runtime tags (shared runtime), the _ptsz flag (--default-stream
per-thread), per-thread counts; the frameworks' big allocations; the call site the report puts on
top; and what budgets do. Each case prints one line

    GPU-SUITE {"case": ..., "apis": {...}, "peak_bytes": ..., "meminfo": [...], "observed": ...}

(run pytest with -s to see them; with CUDATRACE_GPU_SUMMARY=FILE they are also appended to FILE).

Environment:
  CUDATRACE_GPU_BIN=DIR      use programs already built by tools/gpu/build.sh DIR
  CUDATRACE_GPU_SUMMARY=FILE append every case's summary line (JSON) to FILE
  CUDATRACE_GPU_FORCE=1      skip the GPU presence check (developing the suite against the
                             simulated driver, sim/; only driver_api can pass there)
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.paths import GPU_TOOLS, REPO

GPU_DIR = GPU_TOOLS
WORKLOADS = GPU_DIR / "workloads"
MiB = 1 << 20
GiB = 1 << 30


# ---- what is needed, and why a test is skipped ---------------------------------------------
def _gpu_missing() -> str | None:
    if os.environ.get("CUDATRACE_GPU_FORCE") == "1":
        return None
    if not os.path.exists("/dev/nvidia0"):
        return "no NVIDIA GPU here: /dev/nvidia0 does not exist"
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "no NVIDIA driver tools here: nvidia-smi not found"
    try:
        r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi did not answer: {e}"
    if r.returncode != 0 or "GPU " not in r.stdout:
        return "nvidia-smi -L found no working GPU (status %d): %s" % (
            r.returncode,
            (r.stdout + r.stderr).strip()[:200],
        )
    return None


_GPU_WHY = _gpu_missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_GPU_WHY is not None, reason=_GPU_WHY or "")]


def need_module(name: str) -> None:
    """Skip unless `name` is importable by the interpreter the workloads run with."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed for {sys.executable}")


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    cand = os.path.join(home, "bin", "nvcc")
    return cand if os.access(cand, os.X_OK) else None


# ---- the programs --------------------------------------------------------------------------
@pytest.fixture(scope="session")
def bins(tmp_path_factory) -> Path:
    pre = os.environ.get("CUDATRACE_GPU_BIN")
    if pre:
        return Path(pre)
    nvcc = _nvcc()
    if not nvcc:
        pytest.skip("nvcc not found (PATH or $CUDA_HOME/bin): cannot build tools/gpu")
    out = tmp_path_factory.mktemp("gpu-bin")
    t0 = time.monotonic()
    env = dict(os.environ, NVCC=nvcc)
    r = subprocess.run(
        ["bash", str(GPU_DIR / "build.sh"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    print("\nGPU-SUITE-BUILD %.1fs status %d -> %s" % (time.monotonic() - t0, r.returncode, out))
    if r.returncode != 0:  # the programs that did build still run
        _BUILD_LOG.append(r.stdout + r.stderr)
        print("tools/gpu/build.sh failed:\n" + r.stdout + r.stderr)
    return out


_BUILD_LOG: list = []


def program(bins: Path, name: str) -> str:
    p = bins / name
    if not p.exists():
        pytest.fail(
            "{} was not built (tools/gpu/build.sh):\n{}".format(p, "".join(_BUILD_LOG)[-4000:])
        )
    return str(p)


# ---- running a case under cudatrace --------------------------------------------------------
@dataclass
class Result:
    case: str
    cmd: list
    rc: int
    stdout: str
    stderr: str
    dir: Path
    wall: float
    td: object = None
    events: list = field(default_factory=list)
    K: dict = field(default_factory=dict)
    _report: dict | None = None
    report_s: float = 0.0

    def of(self, op: str, *apis: str, ok: bool = True) -> list:
        """Events of operation op (ALLOC, FREE, ...), optionally of these driver APIs."""
        o = self.K["CT_OP_" + op]
        return [
            e
            for e in self.events
            if e["op"] == o and (not apis or e["api_name"] in apis) and (not ok or e["result"] == 0)
        ]

    def report(self) -> dict:
        if self._report is None:
            t0 = time.monotonic()
            r = subprocess.run(
                [sys.executable, "-m", "cudatrace", "report", str(self.dir), "--json"],
                capture_output=True,
                text=True,
                cwd=str(REPO),
                env=_env(),
                timeout=300,
            )
            self.report_s = time.monotonic() - t0
            if r.returncode != 0:
                pytest.fail(
                    "cudatrace report %s --json failed (%d):\n%s"
                    % (self.dir, r.returncode, r.stderr[-3000:])
                )
            try:
                self._report = json.loads(r.stdout)
            except ValueError as e:
                pytest.fail(f"cudatrace report --json printed no JSON ({e}):\n{r.stdout[:2000]}")
        return self._report


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (
        (os.pathsep + env["PYTHONPATH"]) if env.get("PYTHONPATH") else ""
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)  # None: unset
        else:
            env[k] = v
    return env


def ctrace(
    tmp_path: Path, case: str, cmd: list, run_args=(), env: dict | None = None, timeout: int = 300
) -> Result:
    """Run cmd under `python3 -m cudatrace run -o DIR -q [run_args] --` and read the trace."""
    from cudatrace.analyze.read.trace import C, iter_events, read_dir

    out = tmp_path / ("trace-" + case)
    # -q silences the shim's budget lines too (issue 11): runs with a budget keep them
    quiet = ["-q"] if "--budget" not in run_args else []
    argv = [
        sys.executable,
        "-m",
        "cudatrace",
        "run",
        "-o",
        str(out),
        *quiet,
        "--force",
        *run_args,
        "--",
        *cmd,
    ]
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            cwd=str(REPO),
            env=_env(env),
            timeout=timeout,
            preexec_fn=_no_core_dumps,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            "%s: timed out after %ds: %s\nstdout:\n%s\nstderr:\n%s"
            % (case, timeout, " ".join(argv), _s(e.stdout)[-3000:], _s(e.stderr)[-3000:])
        )
    wall = time.monotonic() - t0
    res = Result(case, argv, r.returncode, r.stdout, r.stderr, out, wall, K=C())
    if not out.is_dir() or not list(out.glob("*.ctrace")):
        pytest.fail(
            "%s: no trace written in %s (status %d)\nstdout:\n%s\nstderr:\n%s"
            % (case, out, r.returncode, r.stdout[-3000:], r.stderr[-3000:])
        )
    res.td = read_dir(out)
    for t in res.td.traces:
        for e in iter_events(t):
            e["api_name"] = t.api_name(e["api"])
            e["rt_name"] = t.api_name(e["rt_api"]) if e["rt_api"] else None
            e["pid"] = t.pid
            res.events.append(e)
    res.events.sort(key=lambda e: e["ts_ns"])
    return res


def _no_core_dumps() -> None:
    """--on-exceed abort ends in abort(): no core file of a CUDA process, please."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _s(b) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def expect_status(res: Result, want: int = 0) -> None:
    assert res.rc == want, "%s exited %d, expected %d\nstdout:\n%s\nstderr:\n%s" % (
        res.case,
        res.rc,
        want,
        res.stdout[-3000:],
        res.stderr[-3000:],
    )


def status_or_fail(res: Result, want: int = 0) -> None:
    """A case that did not end as expected: print its summary, then fail with its output."""
    if res.rc != want:
        summarize(res, with_report=False)
        expect_status(res, want)


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


# ---- the one-line summary of a case --------------------------------------------------------
def summarize(res: Result, with_report: bool = True, **extra) -> dict:
    from cudatrace.analyze.replay.model import build

    K = res.K
    opname = {v: k[len("CT_OP_") :] for k, v in K.items() if k.startswith("CT_OP_")}
    apis = Counter()
    failed = Counter()
    for e in res.events:
        key = "{}:{}".format(e["api_name"], opname.get(e["op"], e["op"]))
        if e["result"] == 0:
            apis[key] += 1
        else:
            failed["%s=%d" % (key, e["result"])] += 1
    m = build(res.td)
    mi = []
    infos = [e for e in res.events if e["op"] == K["CT_OP_MEMINFO"]]
    for e in (infos[:1] + infos[-1:]) if len(infos) > 1 else infos:
        mi.append(
            {
                "api": e["api_name"],
                "free": e["addr"],
                "total": e["size"],
                "device_free": e["aux"],
                "device_total": e["aux2"],
                "virtualized": bool(e["flags"] & K["CT_EF_VIRTUALIZED"]),
            }
        )
    d = {
        "case": res.case,
        "status": res.rc,
        "wall_s": round(res.wall, 2),
        "processes": len(res.td.traces),
        "events": len(res.events),
        "apis": dict(sorted(apis.items())),
        "failed": dict(failed),
        "peak_bytes": m.peak_bytes,
        "peak": _fmt(m.peak_bytes),
        "live_at_end": m.end_bytes,
        "host_peak": m.host_peak,
        "meminfo_events": len(infos),
        "meminfo": mi,
    }
    rep = None
    if with_report:
        try:
            rep = res.report()
        except BaseException as e:  # pytest.fail: the summary still gets printed
            d["report_error"] = str(e)[:500]
    if rep is not None:
        d["report_s"] = round(res.report_s, 2)
        d["report_peak_bytes"] = rep.get("peak_bytes")
        sites = rep.get("sites") or []
        if sites:
            d["top_site"] = {
                "bytes": sites[0].get("bytes"),
                "count": sites[0].get("count"),
                "api": sites[0].get("api", sites[0].get("apis")),
                "frames": [_frame_label(f) for f in (sites[0].get("frames") or [])[:3]],
            }
        obs = rep.get("observed")
        if isinstance(obs, dict) and len(json.dumps(obs, default=str)) > 3000:
            obs = {k: v for k, v in obs.items() if not isinstance(v, (list, dict))}
        d["observed"] = obs
    d.update(extra)
    line = json.dumps(d, default=str)
    print("\nGPU-SUITE " + line, flush=True)
    path = os.environ.get("CUDATRACE_GPU_SUMMARY")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
    return d


def _fmt(n) -> str:
    if n is None:
        return "?"
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return "%d B" % n


def _frame_label(f: dict) -> str:
    fn = f.get("function") or "?"
    mod = os.path.basename(f.get("module") or "?")
    where = ""
    if f.get("file"):
        where = " {}:{}".format(os.path.basename(f["file"]), f.get("line"))
    return f"{fn} [{mod}]{where}"


def top_site_mentions(res: Result, *needles: str, frames: int = 4) -> tuple[bool, list[str]]:
    """Whether the report's top site names one of needles (function or module) in its first
    frames; and those frames, for the message."""
    try:
        rep = res.report()
    except BaseException as e:  # reported by summarize; the test fails below
        return False, [f"(cudatrace report failed: {str(e)[:300]})"]
    sites = rep.get("sites") or []
    if not sites:
        return False, ["(the report has no sites)"]
    fr = (sites[0].get("frames") or [])[:frames]
    labels = [_frame_label(f) for f in fr]
    for f in fr:
        # a Python frame's module is its .py file: its package shows in the path
        mod = f.get("module") or ""
        hay = "{} {}".format(
            f.get("function") or "", mod if f.get("python") else os.path.basename(mod)
        )
        if any(n in hay for n in needles):
            return True, labels
    return False, labels


def assert_top_site(res: Result, *needles: str) -> None:
    ok, labels = top_site_mentions(res, *needles)
    assert ok, "{}: the report's top site does not name {}; its frames: {}".format(
        res.case,
        " or ".join(needles),
        labels,
    )


# ---- checking what a C/CUDA program printed against its trace ------------------------------
ALLOC_MAP = {
    "cudaMalloc": {"cuMemAlloc_v2"},
    "cudaMallocAsync": {"cuMemAllocAsync"},
    "cudaMallocFromPoolAsync": {"cuMemAllocFromPoolAsync"},
    "cudaMallocManaged": {"cuMemAllocManaged"},
    "cudaMallocHost": {"cuMemHostAlloc", "cuMemAllocHost_v2"},
    "cudaHostAlloc": {"cuMemHostAlloc"},
    "cudaMallocPitch": {"cuMemAllocPitch_v2", "cuMemAlloc_v2"},
    "cudaMalloc3D": {"cuMemAllocPitch_v2", "cuMemAlloc_v2"},
    "cudaMallocArray": {"cuArrayCreate_v2", "cuArray3DCreate_v2"},
    "cudaMalloc3DArray": {"cuArray3DCreate_v2"},
    "cudaGraphAddMemAllocNode": {"cuGraphAddMemAllocNode"},
    "cuMemAlloc": {"cuMemAlloc_v2"},
    "cuMemCreate": {"cuMemCreate"},
    "cupy": {"cuMemAlloc_v2"},
}
FREE_MAP = {
    "cudaFree": {"cuMemFree_v2"},
    "cudaFreeAsync": {"cuMemFreeAsync"},
    "cudaFreeHost": {"cuMemFreeHost"},
    "cudaFreeArray": {"cuArrayDestroy"},
    "cudaGraphAddMemFreeNode": {"cuGraphAddMemFreeNode"},
    "cuMemFree": {"cuMemFree_v2"},
    "cuMemRelease": {"cuMemRelease"},
    "cupy": {"cuMemFree_v2"},
}
# runtime functions the shim hooks to tag driver events (native/include/hooks.def CT_RUNTIME)
RT_HOOKED = {
    "cudaMalloc",
    "cudaMallocPitch",
    "cudaMallocManaged",
    "cudaMallocAsync",
    "cudaMallocFromPoolAsync",
    "cudaMallocHost",
    "cudaHostAlloc",
    "cudaMalloc3D",
    "cudaMallocArray",
    "cudaMalloc3DArray",
    "cudaFree",
    "cudaFreeAsync",
    "cudaFreeHost",
    "cudaFreeArray",
    "cudaMemGetInfo",
}
ASYNC_APIS = {"cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync"}


@dataclass
class Printed:
    lines: list  # (kind, fields...) in order
    info: dict
    threads: list  # (tid, pairs, size)
    done: bool


def parse_printed(text: str) -> Printed:
    lines, info, threads, done = [], {}, [], False
    for raw in text.splitlines():
        f = raw.split()
        if not f:
            continue
        k = f[0]
        try:
            if k == "alloc" and len(f) == 4:
                lines.append(("alloc", f[1], int(f[2]), int(f[3], 0)))
            elif k == "free" and len(f) == 3:
                lines.append(("free", f[1], int(f[2], 0)))
            elif k == "meminfo" and len(f) == 3:
                lines.append(("meminfo", int(f[1]), int(f[2])))
            elif k == "map" and len(f) == 5:
                lines.append(("map", f[1], int(f[2]), int(f[3], 0), int(f[4], 0)))
            elif k == "unmap" and len(f) == 4:
                lines.append(("unmap", f[1], int(f[2]), int(f[3], 0)))
            elif k == "thread" and len(f) == 4:
                threads.append((int(f[1]), int(f[2]), int(f[3])))
            elif k == "info" and len(f) >= 3:
                info[f[1]] = " ".join(f[2:])
            elif k == "done":
                done = True
        except ValueError:
            pass
    return Printed(lines, info, threads, done)


def _ls(line: tuple) -> str:
    """A parsed printed line, as the program printed it (pointers in hex)."""
    k = line[0]
    hexpos = {"alloc": (3,), "free": (2,), "map": (3, 4), "unmap": (3,)}.get(k, ())
    return " ".join(hex(v) if i in hexpos else str(v) for i, v in enumerate(line))


def _ev(e: dict) -> str:
    return "%s op=%d size=%d addr=0x%x aux=0x%x tid=%d res=%d rt=%s flags=%d" % (
        e["api_name"],
        e["op"],
        e["size"],
        e["addr"],
        e["aux"],
        e["tid"],
        e["result"],
        e["rt_name"],
        e["flags"],
    )


def check_printed(res: Result, flavor: str) -> tuple[dict, list]:
    """Every printed alloc/free/meminfo/map matches exactly one trace event (counted per distinct
    line: an address a program reuses appears once per use). flavor: static, shared, ptsz,
    driver, cupy. Returns figures for the summary and the problems found."""
    K = res.K
    P = parse_printed(res.stdout)
    problems = []
    if not P.done:
        problems.append("the program did not print 'done'")
    main_tid = int(P.info["main_tid"]) if "main_tid" in P.info else None
    matched: dict[int, tuple] = {}

    def matches(line) -> list:
        # lines the program printed come from its main thread; the threads section reuses the
        # same addresses on other threads and is checked by counts below
        return [e for e in _matches(line) if main_tid is None or e["tid"] == main_tid]

    def _matches(line) -> list:
        kind = line[0]
        if kind == "alloc":
            _, api, size, addr = line
            want = ALLOC_MAP.get(api)
            return [
                e
                for e in res.of("ALLOC")
                if e["api_name"] in want and e["size"] == size and e["addr"] == addr
            ]
        if kind == "free":
            _, api, addr = line
            want = FREE_MAP.get(api)
            return [e for e in res.of("FREE") if e["api_name"] in want and e["addr"] == addr]
        if kind == "meminfo":
            _, free, total = line
            return [
                e
                for e in res.of("MEMINFO", "cuMemGetInfo_v2")
                if e["addr"] == free and e["size"] == total
            ]
        if kind == "map":
            _, api, size, va, handle = line
            return [
                e
                for e in res.of("MAP", "cuMemMap")
                if e["size"] == size and e["addr"] == va and e["aux"] == handle
            ]
        if kind == "unmap":
            _, api, size, va = line
            return [
                e for e in res.of("UNMAP", "cuMemUnmap") if e["size"] == size and e["addr"] == va
            ]
        return []

    for line in P.lines:
        if line[0] in ("alloc", "free") and line[1] not in (
            ALLOC_MAP if line[0] == "alloc" else FREE_MAP
        ):
            problems.append(f"test does not know the API of printed line '{_ls(line)}'")
    want_count = Counter(P.lines)
    for line, n in want_count.items():
        found = matches(line)
        if len(found) != n:
            near = []
            if line[0] in ("alloc", "free"):
                addr = line[3] if line[0] == "alloc" else line[2]
                near = [_ev(e) for e in res.events if e["addr"] == addr][:4]
            problems.append(
                "printed '%s' %d time(s), found %d matching event(s)%s"
                % (
                    _ls(line),
                    n,
                    len(found),
                    (f"; events at that address: {near}") if near else "",
                )
            )
            continue
        for e in found:
            matched[id(e)] = line
            api = (
                line[1]
                if line[0] in ("alloc", "free")
                else ("cudaMemGetInfo" if flavor in ("static", "shared", "ptsz") else None)
            )
            if main_tid is not None and e["tid"] != main_tid:
                problems.append(
                    "'%s': event on thread %d, the program's main thread is %d"
                    % (_ls(line), e["tid"], main_tid)
                )
            if flavor == "shared" and api in RT_HOOKED and e["rt_name"] != api:
                problems.append(
                    "'{}': runtime tag {}, expected {} (shared runtime)".format(
                        _ls(line), e["rt_name"], api
                    )
                )
            if flavor in ("static", "ptsz", "driver") and e["rt_api"]:
                problems.append(
                    "'{}': runtime tag {} on a {} build (no runtime hook can fire)".format(
                        _ls(line), e["rt_name"], flavor
                    )
                )
            if e["api_name"] in ASYNC_APIS:
                has = bool(e["flags"] & K["CT_EF_PTSZ"])
                if flavor == "ptsz" and not has:
                    problems.append(
                        f"'{_ls(line)}': {_ev(e)} without CT_EF_PTSZ in the per-thread build"
                    )
                if flavor != "ptsz" and has:
                    problems.append(
                        f"'{_ls(line)}': {_ev(e)} flagged CT_EF_PTSZ in a legacy-stream build"
                    )

    # threads: exact counts per kernel tid
    thread_figs = {}
    for tid, pairs, size in P.threads:
        a = [e for e in res.of("ALLOC", "cuMemAlloc_v2") if e["tid"] == tid and e["size"] == size]
        f = [e for e in res.of("FREE", "cuMemFree_v2") if e["tid"] == tid]
        thread_figs[tid] = (len(a), len(f))
        if len(a) != pairs or len(f) != pairs:
            problems.append(
                "thread %d: %d cuMemAlloc_v2 of %d and %d cuMemFree_v2 traced, made %d pairs"
                % (tid, len(a), size, len(f), pairs)
            )
        for e in a + f:
            matched[id(e)] = ("thread", tid)
            want_rt = "cudaMalloc" if e["op"] == K["CT_OP_ALLOC"] else "cudaFree"
            if flavor == "shared" and e["rt_name"] != want_rt:
                problems.append(
                    "thread %d: %s tagged %s, expected %s"
                    % (tid, e["api_name"], e["rt_name"], want_rt)
                )
                break
    if P.threads:
        size = P.threads[0][2]
        total = len([e for e in res.of("ALLOC", "cuMemAlloc_v2") if e["size"] == size])
        want = sum(p for _, p, _ in P.threads)
        if total != want:
            problems.append(
                "%d cuMemAlloc_v2 of %d bytes in the trace, the threads made %d"
                % (total, size, want)
            )

    unprinted = Counter(
        e["api_name"] + (":failed" if e["result"] else "")
        for e in res.events
        if id(e) not in matched
    )
    figs = {
        "printed_lines": len(P.lines),
        "threads": len(P.threads),
        "unprinted_events": dict(unprinted),
        "info": P.info,
        "problems": len(problems),
    }
    return figs, problems


def assert_no_problems(res: Result, problems: list) -> None:
    assert not problems, "%s: %d problem(s):\n  %s" % (
        res.case,
        len(problems),
        "\n  ".join(problems[:40]),
    )


# =========================================================================================
# C / CUDA programs
# =========================================================================================
@pytest.mark.parametrize("flavor", ["static", "shared", "ptsz"])
def test_runtime_basic(bins, tmp_path, flavor):
    """Every runtime allocation path; static runtime, shared runtime, per-thread default stream."""
    exe = program(bins, "runtime_basic_" + flavor)
    res = ctrace(tmp_path, "runtime_basic_" + flavor, [exe])
    figs, problems = check_printed(res, flavor)
    graph = res.of("ALLOC", "cuGraphAddMemAllocNode")
    ok, frames = top_site_mentions(res, "alloc_big_device")
    async_ev = res.of("ALLOC", *ASYNC_APIS) + res.of("FREE", *ASYNC_APIS)
    ptsz = sum(1 for e in async_ev if e["flags"] & res.K["CT_EF_PTSZ"])
    summarize(
        res,
        **figs,
        graph_alloc_nodes=len(graph),
        async_events=len(async_ev),
        async_ptsz=ptsz,
        top_site_named=ok,
    )
    expect_status(res)
    assert_no_problems(res, problems)
    assert graph, "no cuGraphAddMemAllocNode event"
    assert ok, f"top site does not name alloc_big_device: {frames}"
    # a created stream's allocations (and a capture's) are on its device, the only one here
    assert parse_printed(res.stdout).info.get("capture_ok") == "1", "the capture did not complete"
    assert all(e["device"] == 0 for e in res.of("ALLOC", *ASYNC_APIS)), async_ev
    # a host pool's allocation is pinned host memory, a device pool's device memory
    K, info = res.K, parse_printed(res.stdout).info
    host = [e for e in res.of("ALLOC", *ASYNC_APIS) if e["size"] == 5 * MiB + 4096]
    if info.get("host_pool") == "1":
        assert [e["kind"] for e in host] == [K["CT_KIND_HOST"]], host
    others = [e for e in res.of("ALLOC", *ASYNC_APIS) if e not in host]
    assert others and all(e["kind"] == K["CT_KIND_ASYNC"] for e in others), others


def test_driver_api(bins, tmp_path):
    """Driver API through the PLT (-lcuda): cuMemAlloc_v2, VMM, cuMemGetInfo, own context."""
    exe = program(bins, "driver_api")
    res = ctrace(tmp_path, "driver_api", [exe])
    figs, problems = check_printed(res, "driver")
    ok, frames = top_site_mentions(res, "drv_alloc_big")
    summarize(res, **figs, top_site_named=ok)
    expect_status(res)
    assert_no_problems(res, problems)
    assert ok, f"top site does not name drv_alloc_big: {frames}"


def test_over_budget_denied(bins, tmp_path):
    """--budget 1GiB, cudaMalloc(2 GiB): denied with cudaErrorMemoryAllocation, and said so."""
    exe = program(bins, "over_budget")
    res = ctrace(tmp_path, "over_budget_fail", [exe, "2G"], run_args=["--budget", "1GiB"])
    lines = [l for l in res.stderr.splitlines() if l.startswith("cudatrace: budget exceeded:")]
    denies = res.of("DENY", ok=False)
    summarize(
        res,
        with_report=False,
        budget="1GiB",
        request=2 * GiB,
        denials=len(denies),
        stderr_line=lines[0] if lines else None,
    )
    expect_status(res, 0)
    assert "result cudaErrorMemoryAllocation" in res.stdout
    assert "after cudaSuccess" in res.stdout, "a small allocation after the denial failed"
    assert lines, "no 'cudatrace: budget exceeded:' line on stderr:\n" + res.stderr[-2000:]
    assert any("allocate_giant_pool" in l for l in lines), lines
    assert len(denies) == 1 and denies[0]["size"] == 2 * GiB, [_ev(e) for e in denies]
    assert not [e for e in res.of("ALLOC", "cuMemAlloc_v2") if e["size"] == 2 * GiB]


LAYER_FUNCS = ("eng::Tensor<", "eng::Backend::acquire", "obtain_on_device")


def test_alloc_layers(bins, tmp_path):
    """An engine's allocator hierarchy (tools/gpu/alloc_layers.cu): the report, the summary and
    the budget denial name the KV code (eng::v1::CacheBuffer::CacheBuffer), not the allocator
    it calls; each subsystem is its own site with exact bytes and count (docs/attribution.md)."""
    exe = program(bins, "alloc_layers")
    res = ctrace(tmp_path, "alloc_layers", [exe, "--kv-layers", "28", "--kv-mib", "64"])
    rep = res.report()
    sites = {s["label"].rsplit(" (", 1)[0]: (s["bytes"], s["count"]) for s in rep["sites"]}
    top = rep["sites"][0] if rep["sites"] else {}
    summarize(
        res,
        sites=sites,
        layers=rep.get("attribution", {}).get("layers"),
        top_label=top.get("label"),
        top_via=[f.get("function") for f in top.get("via", [])],
    )
    expect_status(res)
    assert top.get("label", "").startswith("eng::v1::CacheBuffer::CacheBuffer ("), top.get("label")
    assert sites["eng::v1::CacheBuffer::CacheBuffer"] == (28 * 64 * MiB, 28), sites
    assert sites["eng::v1::GPUModelRunner::load_weights"] == (64 * MiB + 20 * MiB, 21), sites
    assert sites["(anon)::build_table"] == (3 * MiB, 1), sites
    assert not [k for k in sites if any(f in k for f in LAYER_FUNCS)], sites
    # under a budget: the shim's line at the moment, then the launcher's attributed one
    out = tmp_path / "trace-alloc_layers_budget"
    argv = [
        sys.executable,
        "-m",
        "cudatrace",
        "run",
        "-o",
        str(out),
        "--force",
        "--budget",
        "1GiB",
        "--",
        exe,
        "--kv-layers",
        "28",
        "--kv-mib",
        "64",
    ]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO), env=_env(), timeout=300)
    shim = [l for l in r.stderr.splitlines() if l.startswith("cudatrace: budget exceeded:")]
    named = [l for l in r.stderr.splitlines() if l.startswith("cudatrace: denied ")]
    print(
        "\nGPU-SUITE "
        + json.dumps(
            {
                "case": "alloc_layers_budget",
                "status": r.returncode,
                "shim_line": shim[:1],
                "named_line": named[:1],
            }
        ),
        flush=True,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert shim and "eng::v1::CacheBuffer::CacheBuffer" in shim[0] and "_Z" not in shim[0], shim
    assert named and " at eng::v1::CacheBuffer::CacheBuffer (alloc_layers.cu:" in named[0], named


def test_over_budget_modes(bins, tmp_path):
    """The same request with no budget (granted), --on-exceed warn (granted, said) and
    --on-exceed abort (the process tree stops with a non-zero status)."""
    exe = program(bins, "over_budget")
    free = ctrace(tmp_path, "over_budget_nobudget", [exe, "2G"])
    assert free.rc == 1, "without a budget the 2 GiB cudaMalloc should succeed:\n" + free.stdout
    assert [e for e in free.of("ALLOC", "cuMemAlloc_v2") if e["size"] == 2 * GiB]

    warn = ctrace(
        tmp_path,
        "over_budget_warn",
        [exe, "2G"],
        run_args=["--budget", "1GiB", "--on-exceed", "warn"],
    )
    wl = [l for l in warn.stderr.splitlines() if l.startswith("cudatrace: budget exceeded:")]
    assert warn.rc == 1, "--on-exceed warn must let the allocation through:\n" + warn.stdout
    assert wl and "allocate_giant_pool" in wl[0], warn.stderr[-2000:]
    big = [e for e in warn.of("ALLOC", "cuMemAlloc_v2") if e["size"] == 2 * GiB]
    assert big and big[0]["flags"] & warn.K["CT_EF_BUDGET_WARN"], [_ev(e) for e in big]

    ab = ctrace(
        tmp_path,
        "over_budget_abort",
        [exe, "2G"],
        run_args=["--budget", "1GiB", "--on-exceed", "abort"],
    )
    al = [l for l in ab.stderr.splitlines() if l.startswith("cudatrace: budget exceeded:")]
    print(
        "\nGPU-SUITE "
        + json.dumps(
            {
                "case": "over_budget_modes",
                "nobudget_status": free.rc,
                "warn_status": warn.rc,
                "warn_line": wl[:1],
                "abort_status": ab.rc,
                "abort_line": al[:1],
            }
        ),
        flush=True,
    )
    assert ab.rc not in (0, 1), "--on-exceed abort: status %d\n%s" % (ab.rc, ab.stderr[-2000:])
    assert al, ab.stderr[-2000:]
    assert "result " not in ab.stdout, "the program went on after the abort:\n" + ab.stdout


# =========================================================================================
# Frameworks
# =========================================================================================
def _torch_tensors(res: Result) -> dict:
    return {d["name"]: d for d in json_lines(res.stdout) if d.get("event") == "tensor"}


C10_NEEDLES = ("CUDACachingAllocator", "c10::cuda", "libc10_cuda")
TORCH_NEEDLES = ("at::", "torch::", "THPVariable", "libtorch")


def top_site_above_c10(res: Result) -> tuple[bool, dict]:
    """The report's top site is code above the c10 caching allocator (the Python line that made
    the tensor, or ATen / the binding), which its via chain holds (docs/attribution.md)."""
    try:
        sites = res.report().get("sites") or []
    except BaseException as e:
        return False, {"error": str(e)[:300]}
    if not sites or not sites[0].get("frames"):
        return False, {"sites": len(sites)}
    f0 = sites[0]["frames"][0]
    hay = "{} {}".format(f0.get("function") or "", os.path.basename(f0.get("module") or ""))
    via = [
        "{} {}".format(v.get("function") or "", os.path.basename(v.get("module") or ""))
        for v in sites[0].get("via") or []
    ]
    # a Python program's site is its Python line (docs/python-frames.md): the torch binding
    # and the caching allocator beneath it are the via chain
    ok = (
        not any(n in hay for n in C10_NEEDLES)
        and (any(n in hay for n in TORCH_NEEDLES) or bool(f0.get("python")))
        and any(n in v for v in via for n in C10_NEEDLES)
    )
    return ok, {"label": sites[0].get("label"), "via": [v.strip() for v in via][:12]}


def test_torch_default_allocator(tmp_path):
    need_module("torch")
    res = ctrace(
        tmp_path,
        "torch_default",
        [sys.executable, str(WORKLOADS / "torch_alloc.py")],
        env={"PYTORCH_CUDA_ALLOC_CONF": None},
    )
    status_or_fail(res)
    ts = _torch_tensors(res)
    big = ts["big"]
    hit = [
        e for e in res.of("ALLOC", "cuMemAlloc_v2") if e["size"] >= GiB and e["addr"] == big["ptr"]
    ]
    stats = [d for d in json_lines(res.stdout) if d.get("event") == "stats"]
    freed = [e for e in res.of("FREE", "cuMemFree_v2") if e["addr"] == ts["act64"]["ptr"]]
    ok, frames = top_site_above_c10(res)
    summarize(
        res,
        torch_stats=stats[-1] if stats else None,
        big_event=[_ev(e) for e in hit],
        top_site_named=ok,
        top_site=frames,
    )
    assert len(hit) == 1, (
        "expected one cuMemAlloc_v2 of >= 1 GiB at the big tensor's address 0x{:x}; "
        "large allocations: {}".format(
            big["ptr"], [_ev(e) for e in res.of("ALLOC") if e["size"] >= 256 * MiB]
        )
    )
    assert len(freed) == 1, (
        "empty_cache() should have freed act64's segment (cuMemFree_v2 at 0x{:x})".format(
            ts["act64"]["ptr"]
        )
    )
    assert ok, f"top site is not torch code above the c10 caching allocator: {frames}"


def test_torch_expandable_segments(tmp_path):
    need_module("torch")
    res = ctrace(
        tmp_path,
        "torch_expandable",
        [sys.executable, str(WORKLOADS / "torch_alloc.py")],
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    status_or_fail(res)
    ts = _torch_tensors(res)
    creates = res.of("ALLOC", "cuMemCreate")
    failed = [e for e in res.events if e["api_name"] == "cuMemCreate" and e["result"] != 0]
    maps = res.of("MAP", "cuMemMap")
    p = ts["big"]["ptr"]
    covering = [e for e in maps if e["addr"] <= p < e["addr"] + e["size"]]
    ok, frames = top_site_above_c10(res)
    summarize(
        res,
        cuMemCreate_ok=len(creates),
        cuMemCreate_failed=len(failed),
        cuMemCreate_bytes=sum(e["size"] for e in creates),
        create_sizes=sorted(Counter(e["size"] for e in creates).items())[:5],
        maps=len(maps),
        top_site_named=ok,
    )
    assert creates, "no successful cuMemCreate with expandable segments"
    assert sum(e["size"] for e in creates) >= GiB
    assert not [e for e in res.of("ALLOC", "cuMemAlloc_v2") if e["size"] >= GiB], (
        "a cuMemAlloc_v2 of >= 1 GiB: expandable segments were not in effect"
    )
    assert covering, f"no cuMemMap covers the big tensor at 0x{p:x}"
    assert ok, f"top site is not torch code above the c10 caching allocator: {frames}"


def _meminfo_total(res: Result) -> int:
    infos = res.of("MEMINFO", "cuMemGetInfo_v2")
    if infos:
        return max(e["aux2"] for e in infos)
    r = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return int(r.stdout.split()[0]) * MiB


def _device_allocs(res: Result) -> list:
    return res.of("ALLOC", "cuMemCreate", "cuMemAlloc_v2")


# JAX's own defaults: preallocation on, 75% of the total
JAX_ENV = {
    "JAX_PLATFORMS": "cuda",
    "XLA_PYTHON_CLIENT_PREALLOCATE": None,
    "XLA_PYTHON_CLIENT_MEM_FRACTION": None,
    "XLA_PYTHON_CLIENT_ALLOCATOR": None,
}


def test_jax_preallocation(tmp_path):
    need_module("jax")
    res = ctrace(
        tmp_path, "jax_prealloc", [sys.executable, str(WORKLOADS / "jax_alloc.py")], env=JAX_ENV
    )
    status_or_fail(res)
    total = _meminfo_total(res)
    allocs = sorted(_device_allocs(res), key=lambda e: -e["size"])
    big = allocs[0] if allocs else None
    result = [d for d in json_lines(res.stdout) if d.get("event") == "result"]
    # the line whose call started the backend, above JAX's own Python and XLA's native frames
    # (docs/python-frames.md: a framework's frames fold under the program's line)
    ok, frames = top_site_mentions(res, "first_array_op", frames=1)
    summarize(
        res,
        device_total=total,
        biggest=_ev(big) if big else None,
        biggest_share=round(big["size"] / total, 4) if big and total else None,
        memory_stats=result[0].get("memory_stats") if result else None,
        top_site_named=ok,
    )
    assert big, "no device allocation traced"
    assert 0.70 * total <= big["size"] <= 0.80 * total, (
        "biggest allocation %d is not ~75%% of the %d total" % (big["size"], total)
    )
    assert len([e for e in allocs if e["size"] >= 0.5 * total]) == 1
    assert ok, f"top site is not the workload's first_array_op: {frames}"


def test_cupy_arrays(tmp_path):
    need_module("cupy")
    res = ctrace(tmp_path, "cupy_arrays", [sys.executable, str(WORKLOADS / "cupy_alloc.py")])
    figs, problems = check_printed(res, "cupy")
    # the workload's line that called cupy.zeros, CuPy's own Python and native frames folded
    ok, frames = top_site_mentions(res, "allocate_arrays", frames=1)
    summarize(res, **figs, top_site_named=ok)
    expect_status(res)
    assert_no_problems(res, problems)
    assert ok, f"top site is not the workload's allocate_arrays: {frames}"


# =========================================================================================
# Budgets with frameworks
# =========================================================================================
def test_jax_under_budget(tmp_path):
    need_module("jax")
    budget = 8 * GiB
    res = ctrace(
        tmp_path,
        "jax_budget_8GiB",
        [sys.executable, str(WORKLOADS / "jax_alloc.py")],
        run_args=["--budget", "8GiB"],
        env=JAX_ENV,
    )
    result = [d for d in json_lines(res.stdout) if d.get("event") == "result"]
    allocs = sorted(_device_allocs(res), key=lambda e: -e["size"])
    infos = res.of("MEMINFO", "cuMemGetInfo_v2")
    from cudatrace.analyze.replay.model import build

    peak = build(res.td).peak_bytes
    summarize(
        res,
        budget=budget,
        biggest=_ev(allocs[0]) if allocs else None,
        denials=len(res.of("DENY", ok=False)),
        memory_stats=result[0].get("memory_stats") if result else None,
    )
    expect_status(res)
    assert result and result[0]["sum"] == 499500.0
    assert infos, "JAX read no cuMemGetInfo_v2"
    assert all(e["flags"] & res.K["CT_EF_VIRTUALIZED"] and e["size"] == budget for e in infos), (
        "cuMemGetInfo was not virtualized to the budget: %s" % [_ev(e) for e in infos[:3]]
    )
    assert allocs and 0.5 * budget <= allocs[0]["size"] <= budget, (
        "JAX's preallocation is not inside the budget: %s" % (_ev(allocs[0]) if allocs else None)
    )
    assert peak <= budget
    assert not res.of("DENY", ok=False), "JAX was denied memory under an 8 GiB budget"


def test_torch_oom_under_budget(tmp_path):
    need_module("torch")
    res = ctrace(
        tmp_path,
        "torch_oom_4GiB",
        [sys.executable, str(WORKLOADS / "torch_oom.py")],
        run_args=["--budget", "4GiB"],
        env={"PYTORCH_CUDA_ALLOC_CONF": None},
    )
    out = [d for d in json_lines(res.stdout) if d.get("event") in ("oom", "no_oom")]
    from cudatrace.analyze.replay.model import build

    peak = build(res.td).peak_bytes
    summarize(
        res,
        with_report=False,
        budget=4 * GiB,
        outcome=out[0] if out else None,
        denials=len(res.of("DENY", ok=False)),
    )
    expect_status(res)
    assert out and out[0]["event"] == "oom", res.stdout[-2000:]
    assert 3 * GiB <= out[0]["allocated_bytes"] <= 4 * GiB, out[0]
    assert res.of("DENY", ok=False), "no DENY event: the OOM did not come from the budget"
    assert peak <= 4 * GiB
