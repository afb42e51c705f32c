"""Every route into the driver yields exactly one event per call, with the right fields.

The route programs (tests/progs/route_*.c) print one line per operation (op api size ptr
result); the trace must hold the same sequence of events.
"""

from __future__ import annotations

import subprocess

import pytest

from cudatrace.analyze.read.trace import C, iter_events, read_dir

OPS = {
    "alloc": "CT_OP_ALLOC",
    "free": "CT_OP_FREE",
    "map": "CT_OP_MAP",
    "unmap": "CT_OP_UNMAP",
    "import": "CT_OP_IMPORT",
    "unimport": "CT_OP_UNIMPORT",
    "meminfo": "CT_OP_MEMINFO",
}


def expected_ops(stdout: str):
    out = []
    for line in stdout.splitlines():
        parts = line.split()
        if not parts or parts[0] not in OPS:
            continue
        op, api = parts[0], parts[1]
        if op == "meminfo":
            total = None if parts[2] == "-" else int(parts[2])
            free = None if parts[3] == "-" else int(parts[3])
            out.append((op, api, total, free, int(parts[4])))
        else:
            out.append((op, api, int(parts[2]), int(parts[3], 16), int(parts[4])))
    return out


def traced_ops(out_dir):
    td = read_dir(out_dir)
    assert len(td.traces) == 1, [t.path for t in td.traces]
    t = td.traces[0]
    assert t.complete
    K = C()
    names = {K[v]: k for k, v in OPS.items()}
    evs = sorted(iter_events(t), key=lambda e: e["ts_ns"])
    return t, [(names.get(e["op"], "?%d" % e["op"]), t.api_name(e["api"]), e) for e in evs]


ROUTES = [
    ("route_link", []),
    ("route_link", ["--ptsz"]),
    ("route_dlsym", []),
    ("route_gpa", []),
    ("route_gpa", ["--ptsz"]),
    ("route_gpa", ["--v1"]),
    ("route_gpa", ["--old-abi"]),
]


@pytest.mark.parametrize("prog,args", ROUTES, ids=[" ".join([p] + a) for p, a in ROUTES])
def test_route_events_match_calls(ct, sim, prog, args):
    r = ct.run([sim.progs[prog], *args])
    assert r.returncode == 0, r.stderr + r.stdout
    want = expected_ops(r.stdout)
    assert len(want) > 30
    # the pre-3.2 ABI (--old-abi) is handed out unwrapped: the driver's own, never counted
    want = [w for w in want if w[1] not in ("cuMemAlloc", "cuMemFree")]
    t, got = traced_ops(r.out)
    K = C()
    assert len(got) == len(want), (want, [(o, a) for o, a, _ in got])
    for w, (op, api, e) in zip(want, got):
        wop, wapi = w[0], w[1]
        ptsz = wapi.endswith("_ptsz")
        assert op == wop and api == wapi.replace("_ptsz", ""), (w, op, api)
        assert bool(e["flags"] & K["CT_EF_PTSZ"]) == ptsz, (w, e)
        if wop == "meminfo":
            _, _, total, free, res = w
            assert e["result"] == res
            if total is not None:
                assert e["size"] == total
            if free is not None:
                assert e["addr"] == free
            continue
        _, _, size, ptr, res = w
        assert e["result"] == res, (w, e)
        assert e["addr"] == ptr, (w, hex(e["addr"]))
        if wop in ("alloc", "map") or (wop == "import" and size):
            assert e["size"] == size, (w, e)
        assert e["device"] == 0, (w, e)
        assert e["tid"] > 0


def test_ptsz_route_calls_the_per_thread_driver_functions(ct, sim, tmp_path):
    calls = tmp_path / "calls.txt"
    env = ct.env(calls=str(calls))
    r = ct.run([sim.progs["route_gpa"], "--ptsz"], env=env)
    assert r.returncode == 0, r.stderr
    counts = {}
    for line in calls.read_text().splitlines():
        _pid, sym, n = line.split()
        counts[sym] = counts.get(sym, 0) + int(n)
    assert counts.get("cuMemAllocAsync_ptsz") == 1 and "cuMemAllocAsync" not in counts
    assert counts.get("cuMemFreeAsync_ptsz") == 2 and "cuMemFreeAsync" not in counts


def _symbol_range(binary, name):
    out = subprocess.run(
        ["nm", "-S", "--defined-only", str(binary)], capture_output=True, text=True, check=True
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == name:
            start = int(parts[0], 16)
            return start, start + int(parts[1], 16)
    raise AssertionError(f"{name} not in {binary}")


@pytest.mark.parametrize("prog", ["route_link", "route_dlsym", "route_gpa"])
def test_stack_return_address_is_in_calling_function(ct, sim, prog):
    r = ct.run([sim.progs[prog]])
    assert r.returncode == 0, r.stderr
    t, got = traced_ops(r.out)
    lo, hi = _symbol_range(sim.progs[prog], "do_alloc_device")
    alloc = next(e for op, api, e in got if api == "cuMemAlloc_v2")
    frames = t.stack(alloc["stack"])
    assert frames, "no stack recorded"
    mod = t.module_for(frames[0])
    assert mod is not None and mod.path == str(sim.progs[prog]), (mod, frames[:3])
    assert mod.build_id, "module map lacks the build-id"
    off = frames[0] - mod.base
    assert lo < off <= hi, (hex(off), hex(lo), hex(hi))
    # the whole stack reaches main
    mlo, mhi = _symbol_range(sim.progs[prog], "main")
    assert any(mlo < f - mod.base <= mhi for f in frames if t.module_for(f) is mod)


def test_stack_depth_zero_records_no_stacks(ct, sim):
    r = ct.run([sim.progs["route_link"]], "--stack-depth", "0")
    assert r.returncode == 0
    t, got = traced_ops(r.out)
    assert got and all(e["stack"] == 0 for _, _, e in got)
    assert t.stack_depth == 0


def test_stack_depth_limits_frames(ct, sim):
    r = ct.run([sim.progs["route_link"]], "--stack-depth", "2")
    t, got = traced_ops(r.out)
    assert max(len(t.stack(e["stack"])) for _, _, e in got) == 2


PLUGIN = r"""
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuMemAlloc_v2(CUdeviceptr *, unsigned long);
int cuMemFree_v2(CUdeviceptr);
__attribute__((noinline)) int plugin_alloc(void)
{
    CUdeviceptr p;
    cuInit(0);
    int r = cuMemAlloc_v2(&p, 5u << 20);
    return r ? r : cuMemFree_v2(p);
}
"""

LOADER = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    int (*f)(void) = (int (*)(void))dlsym(h, "plugin_alloc");
    return f ? f() : 3;
}
"""


def test_library_loaded_later_by_dlopen_is_in_the_module_map(ct, sim, tmp_path):
    (tmp_path / "plugin.c").write_text(PLUGIN)
    (tmp_path / "loader.c").write_text(LOADER)
    lib = tmp_path / "libplugin.so"
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-g",
            "-O1",
            "-Wl,--build-id",
            "-o",
            str(lib),
            str(tmp_path / "plugin.c"),
            f"-L{sim.lib}",
            "-lcuda",
        ],
        check=True,
    )
    exe = tmp_path / "loader"
    subprocess.run(["cc", "-g", "-o", str(exe), str(tmp_path / "loader.c"), "-ldl"], check=True)
    r = ct.run([exe, lib])
    assert r.returncode == 0, r.stderr
    t, got = traced_ops(r.out)
    alloc = next(e for op, api, e in got if api == "cuMemAlloc_v2")
    frames = t.stack(alloc["stack"])
    mod = t.module_for(frames[0])
    assert mod is not None and mod.path == str(lib) and mod.build_id
    from cudatrace.symbols import ModuleRef, Symbolizer

    res = Symbolizer().symbolize(ModuleRef(mod.path, mod.build_id, mod.base), [frames[0] - 1])
    assert res[frames[0] - 1][-1].function == "plugin_alloc"
