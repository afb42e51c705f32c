"""The shim on aarch64 (the Jetson's architecture), under qemu-user, on every route.

The preload library (tools/cross-build-shim), the simulated driver and the test programs are
cross-built with aarch64-linux-gnu-gcc and run under qemu-aarch64 -L <Debian's arm64 sysroot>;
the traces are read by the (x86-64) Python reader. Needs: apt-get install gcc-aarch64-linux-gnu
libc6-dev-arm64-cross qemu-user (.ci/run installs them). Without them the tests skip, except
in CI (CI=true), where a missing tool fails the suite.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_routes import expected_ops, traced_ops

from cudatrace.analyze.read.trace import C, read_dir
from support import calltree, cross
from support.paths import REPO, TESTS  # noqa: F401

CC = cross.CC
QEMU = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")
GiB = 1 << 30


def require_tools():
    missing = [t for t in (CC, QEMU, "aarch64-linux-gnu-nm") if not shutil.which(t)]
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        missing.append(str(SYSROOT / "lib/ld-linux-aarch64.so.1"))
    if missing:
        msg = (
            "aarch64 tools missing ({}): apt-get install gcc-aarch64-linux-gnu "
            "libc6-dev-arm64-cross qemu-user".format(", ".join(missing))
        )
        pytest.fail(msg + " -- the aarch64 suite is part of the tests (.ci/run installs them)")


@pytest.fixture(scope="module")
def a64(tmp_path_factory):
    require_tools()
    work = tmp_path_factory.mktemp("aarch64")
    shim, paths = cross.aarch64(tmp_path_factory)  # built once for the session's workers
    assert shim.is_file() and shim.name == "libcudatrace.so"
    return SimpleNamespace(work=work, shim=shim, paths=paths, n=0)


def qrun(a64, prog, args=(), extra_env=None, shim=None, timeout=300):
    a64.n += 1
    out = a64.work / ("trace%d" % a64.n)
    out.mkdir()
    env = {
        "LD_LIBRARY_PATH": str(a64.paths["libdir"]),
        "CUDATRACE_DIR": str(out),
        "LD_PRELOAD": str(shim or a64.shim),
        "LD_BIND_NOW": "1",
    }
    env.update(extra_env or {})
    cmd = [QEMU, "-L", str(SYSROOT)]
    for k, v in env.items():
        cmd += ["-E", f"{k}={v}"]
    r = subprocess.run(
        cmd + [str(prog), *map(str, args)], capture_output=True, text=True, timeout=timeout
    )
    r.out = out
    return r


def events(t, op):
    from cudatrace.analyze.read.trace import event_fields

    names = event_fields()
    return [dict(zip(names, e)) for e in t.events if e[names.index("op")] == C()[op]]


def symbol_of(a64, binary, addr):
    """the function of binary holding the file address addr (nm of the aarch64 binutils)"""
    out = subprocess.run(
        ["aarch64-linux-gnu-nm", "-S", "--defined-only", str(binary)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW" and int(p[0], 16) <= addr < int(p[0], 16) + int(p[1], 16):
            return p[3]
    return None


@pytest.mark.parametrize(
    "prog,args",
    [
        ("route_link", []),
        ("route_link", ["--ptsz"]),
        ("route_dlsym", []),
        ("route_gpa", []),
        ("route_gpa", ["--ptsz"]),
    ],
)
def test_routes_under_qemu(a64, prog, args):
    r = qrun(a64, a64.paths[prog], args)
    assert r.returncode == 0, r.stderr[-3000:]
    want = [w for w in expected_ops(r.stdout) if w[1] not in ("cuMemAlloc", "cuMemFree")]
    t, got = traced_ops(r.out)
    assert t.arch == "aarch64" and t.complete
    assert len(want) == len(got) and want
    for w, (op, api, e) in zip(want, got):
        assert (op, api) == (w[0], w[1].replace("_ptsz", "")), (w, op, api)
        if w[0] != "meminfo":
            assert (e["addr"], e["result"]) == (w[3], w[4]), (w, e)
        if w[1].endswith("_ptsz"):
            assert e["flags"] & C()["CT_EF_PTSZ"], (w, e)
        assert e["stack"], ("no stack", w)
    assert t.info.get("dlsym_version") == "GLIBC_2.34"  # Debian's glibc 2.36 for arm64
    # symbolized: the first frame is the program's do_alloc_device, and the stack reaches main
    alloc = next(e for op, api, e in got if api == "cuMemAlloc_v2")
    frames = t.stack(alloc["stack"])
    mod = t.module_for(frames[0])
    assert mod is not None and mod.path == str(a64.paths[prog]) and mod.build_id
    names = [symbol_of(a64, mod.path, f - 1 - mod.base) for f in frames if t.module_for(f) is mod]
    assert names[0] == "do_alloc_device" and "main" in names, names
    from cudatrace.symbols import ModuleRef, Symbolizer

    res = Symbolizer().symbolize(ModuleRef(mod.path, mod.build_id, mod.base), [frames[0] - 1])
    assert res[frames[0] - 1][-1].function == "do_alloc_device"


def test_threads_under_qemu(a64):
    r = qrun(a64, a64.paths["threads"], [4, 500, 4096])
    assert r.returncode == 0, r.stderr[-3000:]
    t = read_dir(r.out).traces[0]
    assert t.complete and t.arch == "aarch64"
    assert len(events(t, "CT_OP_ALLOC")) == 2000 and len(events(t, "CT_OP_FREE")) == 2000
    # every event's stack counted once; the loops are served by the cache
    assert t.stack_unwinds_full + t.stack_cache_hits == t.n_events
    assert t.stack_unwinds_full <= 0.01 * t.n_events, (t.stack_unwinds_full, t.n_events)


def test_fork_exec_under_qemu(a64):
    via = f"{shutil.which(QEMU)} -L {SYSROOT}"
    r = qrun(a64, a64.paths["forkexec"], ["--fork-child", 2], {"FORKEXEC_VIA": via})
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout
    td = read_dir(r.out)
    assert len(td.traces) == 4, [t.describe() for t in td.traces]
    pids = {t.pid for t in td.traces}
    for t in td.traces:
        assert t.complete and t.arch == "aarch64", t.describe()
        assert len(events(t, "CT_OP_ALLOC")) == 1
    assert sum(1 for t in td.traces if t.ppid in pids) >= 2


def test_budget_under_qemu(a64, tmp_path, monkeypatch):
    from cudatrace.record import budget

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    ledger, _ = budget.setup_ledger("2GiB", None)
    try:
        r = qrun(
            a64,
            a64.paths["hold"],
            ["--exit-after-ms", 10, "--free", 3, "1g"],
            {"CUDATRACE_LEDGER": str(ledger.path)},
        )
    finally:
        ledger.finish()
    assert r.returncode == 1, r.stderr[-3000:]
    lines = [l for l in r.stderr.splitlines() if l.startswith("cudatrace: budget exceeded:")]
    assert len(lines) == 1 and "hold_alloc" in lines[0] and "budget 2.00 GiB" in lines[0], r.stderr
    assert [int(l.split()[4]) for l in r.stdout.splitlines() if l.startswith("alloc ")] == [0, 0, 2]
    t = read_dir(r.out).traces[0]
    deny = events(t, "CT_OP_DENY")
    assert len(deny) == 1 and deny[0]["size"] == GiB and deny[0]["stack"]


@pytest.mark.parametrize("seed", [11, 12])
def test_cached_stacks_equal_full_unwinds_on_random_call_trees(a64, seed):
    """Every event unwound both ways (CUDATRACE_STACK_VERIFY=1): frame pointers kept and
    omitted, -O0..-O2, alloca and VLAs, tail calls, pointer calls, recursion, a shared library,
    return-address signing (PAC, which qemu's default CPU implements)."""
    exe = calltree.build(CC, a64.work / ("calltree%d" % seed), a64.paths["libdir"], seed, "aarch64")
    r = qrun(a64, exe, [1500, seed, 2], {"CUDATRACE_STACK_VERIFY": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "MISMATCH" not in r.stderr, r.stderr[-3000:]
    t = read_dir(r.out).traces[0]
    assert t.n_events > 5000
    assert t.stack_mismatches == 0
    assert t.stack_verified == t.n_events
    assert t.stack_unwinds_full + t.stack_cache_hits == t.n_events
    assert t.stack_cache_hits >= 0.97 * t.n_events, (t.stack_cache_hits, t.n_events)


def test_real_dlsym_versions_are_tried_in_order(a64):
    """A build whose list starts with a version no glibc has: the next ones are tried, and the
    trace names the one found (aarch64's base version, GLIBC_2.17, here)."""
    versions = r"-DCT_DLSYM_VERSIONS=\"GLIBC_0.1\",\"GLIBC_2.2.5\",\"GLIBC_2.17\""
    r = subprocess.run(
        [
            str(REPO / "tools" / "cross-build-shim"),
            CC,
            str(a64.work / "shim-order"),
            "CFLAGS=-O2 -g " + versions,
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    r = qrun(a64, a64.paths["route_dlsym"], shim=Path(r.stdout.strip()))
    assert r.returncode == 0, r.stderr[-3000:]
    t, got = traced_ops(r.out)
    assert t.info.get("dlsym_version") == "GLIBC_2.17" and got


def test_missing_tools_fail_saying_what_to_install(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="apt-get install"):
        require_tools()
