"""Tests of the simulated CUDA driver, simulated NVML and the test programs themselves, run
WITHOUT any tracer preloaded: they prove the ground the cudatrace tests stand on."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import children, simbuild

MiB = 1 << 20
GiB = 1 << 30
DEFAULT_TOTAL = 16 * GiB


# ---- helpers -----------------------------------------------------------------------------------


def hooks() -> list[dict]:
    """CT_DRIVER entries of native/include/hooks.def: id, base, minver, ptsz."""
    text = (simbuild.SHIM / "hooks.def").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return [
        {"id": m[0], "base": m[1], "minver": int(m[2]), "ptsz": m[3] == "1"}
        for m in re.findall(r'CT_DRIVER\(\s*(\w+),\s*"(\w+)",\s*(\d+),\s*([01])', text)
    ]


def exported_functions(lib: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    return {
        f[2] for f in (line.split() for line in out.splitlines()) if len(f) == 3 and f[1] == "T"
    }


PRELUDE = textwrap.dedent("""
    import ctypes, json, sys
    from ctypes import byref, c_int, c_uint, c_size_t, c_void_p, c_ulonglong, c_char_p
    cu = ctypes.CDLL("libcuda.so.1")
    def addr(name):
        return ctypes.cast(getattr(cu, name), c_void_p).value
    def gpa(name, version, flags=0, v1=False, null_status=False):
        p = c_void_p(12345)
        st = c_int(-7)
        if v1:
            r = cu.cuGetProcAddress(name.encode(), byref(p), version, c_ulonglong(flags))
        else:
            r = cu.cuGetProcAddress_v2(name.encode(), byref(p), version, c_ulonglong(flags),
                                       None if null_status else byref(st))
        return r, p.value, st.value
    def stats(dev=0):
        u, h, t = c_ulonglong(), c_ulonglong(), c_ulonglong()
        assert cu.cudasim_device_stats(dev, byref(u), byref(h), byref(t)) == 0
        return u.value, h.value, t.value
    def alloc(n):
        p = c_ulonglong()
        r = cu.cuMemAlloc_v2(byref(p), c_size_t(n))
        return r, p.value
    def meminfo():
        f, t = c_size_t(), c_size_t()
        r = cu.cuMemGetInfo_v2(byref(f), byref(t))
        return r, f.value, t.value
    out = {}
""")


def run_py(sim, code: str, **opts) -> dict:
    """Run PRELUDE + code in a fresh python on the simulator; returns the `out` dict it fills."""
    script = PRELUDE + textwrap.dedent(code) + "\nprint(json.dumps(out))\n"
    res = subprocess.run(
        [sys.executable, "-c", script],
        env=sim.env(**opts),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def ops(res) -> list[simbuild.Op]:
    return simbuild.parse_ops(res.stdout)


# What route_seq.h promises, in order: (op, api, size); meminfo lines are checked separately.
def route_expected(ptsz: bool, old_abi: bool = False) -> list[tuple[str, str, int]]:
    s = "_ptsz" if ptsz else ""
    seq = [
        ("alloc", "cuMemAlloc_v2", 11 * MiB),
        ("alloc", "cuMemAllocPitch_v2", 1024 * 1200),
        ("alloc", "cuMemAllocManaged", 13 * MiB),
        ("alloc", "cuMemAllocAsync" + s, 14 * MiB),
        ("alloc", "cuMemAllocFromPoolAsync" + s, 15 * MiB),
        ("alloc", "cuMemCreate", 16 * MiB),
        ("map", "cuMemMap", 16 * MiB),
        ("free", "cuMemRelease", 16 * MiB),
        ("alloc", "cuMemHostAlloc", 17 * MiB),
        ("alloc", "cuMemAllocHost_v2", 18 * MiB),
        ("alloc", "cuArrayCreate_v2", 640 * 480 * 4 * 4),
        ("alloc", "cuArray3DCreate_v2", 96 * 64 * 32 * 2 * 2),
        ("alloc", "cuMipmappedArrayCreate", (256 * 256 + 128 * 128 + 64 * 64) * 4),
        ("alloc", "cuGraphAddMemAllocNode", 19 * MiB),
        ("free", "cuGraphAddMemFreeNode", 19 * MiB),
        ("free", "cuMipmappedArrayDestroy", (256 * 256 + 128 * 128 + 64 * 64) * 4),
        ("free", "cuArrayDestroy", 96 * 64 * 32 * 2 * 2),
        ("free", "cuArrayDestroy", 640 * 480 * 4 * 4),
        ("free", "cuMemFreeHost", 18 * MiB),
        ("free", "cuMemFreeHost", 17 * MiB),
        ("unmap", "cuMemUnmap", 16 * MiB),
        ("free", "cuMemFreeAsync" + s, 15 * MiB),
        ("free", "cuMemFreeAsync" + s, 14 * MiB),
        ("free", "cuMemFree_v2", 13 * MiB),
        ("free", "cuMemFree_v2", 1024 * 1200),
        ("free", "cuMemFree_v2", 11 * MiB),
        ("import", "cuIpcOpenMemHandle_v2", 0),
        ("unimport", "cuIpcCloseMemHandle", 0),
        ("import", "cuMemImportFromShareableHandle", 0),
        ("free", "cuMemRelease", 0),
        ("import", "cuImportExternalMemory", 21 * MiB),
        ("unimport", "cuDestroyExternalMemory", 21 * MiB),
    ]
    if old_abi:
        seq += [("alloc", "cuMemAlloc", 20 * MiB), ("free", "cuMemFree", 20 * MiB)]
    return seq


# device bytes live at the middle meminfo of the route sequence (host memory not counted)
ROUTE_DEVICE_BYTES = (
    11 * MiB
    + 1024 * 1200
    + 13 * MiB
    + 14 * MiB
    + 15 * MiB
    + 16 * MiB
    + 640 * 480 * 16
    + 96 * 64 * 32 * 4
    + (256 * 256 + 128 * 128 + 64 * 64) * 4
    + 19 * MiB
)
ROUTE_HOST_BYTES = 17 * MiB + 18 * MiB


def check_route(
    res, ptsz: bool, old_abi: bool = False, total: int = DEFAULT_TOTAL, integrated: bool = False
):
    assert res.returncode == 0, res.stdout + res.stderr
    got = ops(res)
    mem = [o for o in got if o.op != "meminfo"]
    assert [(o.op, o.api, o.size) for o in mem] == route_expected(ptsz, old_abi)
    assert all(o.result == 0 for o in got)
    # alloc/free pairs name the same pointer or handle
    by_api = {}
    for o in mem:
        by_api.setdefault(o.op, []).append(o)
    allocs = [o.ptr for o in mem if o.op == "alloc"]
    assert len(set(allocs)) == len(allocs)
    assert all(o.ptr for o in mem if o.op in ("alloc", "map", "unmap", "import"))
    info = [o for o in got if o.op == "meminfo"]
    assert len(info) == 6
    live = ROUTE_DEVICE_BYTES + (ROUTE_HOST_BYTES if integrated else 0)
    assert (info[0].size, info[0].ptr) == (total, total)
    assert (info[1].size, info[1].ptr) == (total, total - live)
    assert (info[2].size, info[2].ptr) == (total, None)
    assert (info[3].size, info[3].ptr) == (None, total - live)
    assert (info[4].size, info[4].ptr) == (None, None)
    assert (info[5].size, info[5].ptr) == (total, total)
    return got


def wait_ready(proc: subprocess.Popen, timeout: float = 20) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = children.readline(proc)
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if line.strip() == "ready":
            return lines
    raise AssertionError(f"program did not get ready: {lines}")


def popen(sim, prog: str, *args, env=None, **opts) -> subprocess.Popen:
    return children.popen(
        [str(sim.progs[prog]), *map(str, args)],
        env=env or sim.env(**opts),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ---- build ---------------------------------------------------------------------------------------


def test_build_products(sim):
    assert (sim.lib / "libcuda.so.1").is_file()
    assert os.readlink(sim.lib / "libcuda.so") == "libcuda.so.1"
    assert (sim.lib / "libnvidia-ml.so.1").is_file()
    assert os.readlink(sim.lib / "libnvidia-ml.so") == "libnvidia-ml.so.1"
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        dyn = subprocess.run(
            ["readelf", "-d", str(sim.lib / name)], capture_output=True, text=True
        ).stdout
        assert f"[{name}]" in dyn and "SONAME" in dyn
    for name, path in sim.progs.items():
        if name == "static_prog" and path is None:
            continue
        assert path is not None and path.is_file(), name
    # no rpath anywhere: LD_LIBRARY_PATH alone finds the simulator
    for path in [p for p in sim.progs.values() if p]:
        dyn = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
        assert "RPATH" not in dyn and "RUNPATH" not in dyn, path


def test_build_is_cached(sim, tmp_path):
    out = tmp_path / "b"
    first = simbuild.build_all(out)
    mtimes = {k: v.stat().st_mtime_ns for k, v in first.items() if v and v.is_file()}
    second = simbuild.build_all(out)
    assert {k: v.stat().st_mtime_ns for k, v in second.items() if v and v.is_file()} == mtimes


def test_sim_env_options(sim):
    env = simbuild.sim_env(sim.lib, state="/x", total_bytes=[1, 2], integrated=True, fail_nth=None)
    assert env == {
        "LD_LIBRARY_PATH": str(sim.lib),
        "CUDASIM_STATE": "/x",
        "CUDASIM_TOTAL_BYTES": "1,2",
        "CUDASIM_INTEGRATED": "1",
    }
    with pytest.raises(TypeError):
        simbuild.sim_env(sim.lib, bogus=1)
    full = sim.env(devices=2)
    assert full["LD_LIBRARY_PATH"].split(":")[0] == str(sim.lib)
    assert full["CUDASIM_DEVICES"] == "2" and "LD_PRELOAD" not in full


# ---- exports and cuGetProcAddress -------------------------------------------------------------


def test_exports_every_hooked_function_and_twin(sim):
    names = exported_functions(sim.lib / "libcuda.so.1")
    for h in hooks():
        assert h["id"] in names, h["id"]
        if h["ptsz"]:
            assert h["id"] + "_ptsz" in names
    required = [
        "cuInit",
        "cuDriverGetVersion",
        "cuDeviceGetCount",
        "cuDeviceGet",
        "cuDeviceGetName",
        "cuDeviceTotalMem_v2",
        "cuDeviceGetAttribute",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease_v2",
        "cuCtxCreate_v2",
        "cuCtxDestroy_v2",
        "cuCtxSetCurrent",
        "cuCtxGetCurrent",
        "cuCtxGetDevice",
        "cuCtxSynchronize",
        "cuStreamCreate",
        "cuStreamDestroy_v2",
        "cuGetErrorName",
        "cuGetErrorString",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuGetExportTable",
        "cuMemAlloc",
        "cuMemFree",
        "cuMemGetInfo",
        "cuMemAllocHost",
        "cuArrayCreate",
        "cuIpcOpenMemHandle",
        "cudasim_device_stats",
    ]
    assert not [n for n in required if n not in names]
    nvml = exported_functions(sim.lib / "libnvidia-ml.so.1")
    assert {
        "nvmlInit_v2",
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
    } <= nvml


def test_gpa_selects_hooks_def_variants(sim):
    out = run_py(
        sim,
        f"""
        hooks = {hooks()!r}
        bad = []
        for h in hooks:
            want = addr(h["id"])
            twin = addr(h["id"] + "_ptsz") if h["ptsz"] else want
            if h["ptsz"] and twin == want:
                bad.append(("twin not distinct", h["id"]))
            for ver, flags, exp in [(13000, 0, want), (h["minver"], 0, want), (13000, 1, want),
                                    (13000, 2, twin), (13000, 3, twin), (h["minver"], 2, twin)]:
                r, p, st = gpa(h["base"], ver, flags)
                if (r, p, st) != (0, exp, 0):
                    bad.append((h["base"], ver, flags, r, p, st, exp))
            r, p, st = gpa(h["base"], h["minver"] - 10)
            older = p is not None and p != want
            if not older and (r, p, st) != (0, None, 2):
                bad.append(("below", h["base"], r, p, st))
        out["bad"] = bad
    """,
    )
    assert out["bad"] == []


def test_gpa_semantics(sim):
    out = run_py(
        sim,
        """
        out["alloc_old"] = gpa("cuMemAlloc", 3010)[1] == addr("cuMemAlloc")
        out["alloc_new"] = gpa("cuMemAlloc", 3020)[1] == addr("cuMemAlloc_v2")
        out["alloc_2000"] = gpa("cuMemAlloc", 2000)[1] == addr("cuMemAlloc")
        out["ipc_4010"] = gpa("cuIpcOpenMemHandle", 4010)[1] == addr("cuIpcOpenMemHandle")
        out["ipc_10020"] = gpa("cuIpcOpenMemHandle", 10020)[1] == addr("cuIpcOpenMemHandle")
        out["ipc_11000"] = gpa("cuIpcOpenMemHandle", 11000)[1] == addr("cuIpcOpenMemHandle_v2")
        out["gpa_11030"] = gpa("cuGetProcAddress", 11030)[1] == addr("cuGetProcAddress")
        out["gpa_12000"] = gpa("cuGetProcAddress", 12000)[1] == addr("cuGetProcAddress_v2")
        out["meminfo_old"] = gpa("cuMemGetInfo", 3000)[1] == addr("cuMemGetInfo")
        out["ctxgetdevice_12000"] = gpa("cuCtxGetDevice", 12000)[1] == addr("cuCtxGetDevice")
        out["ctxgetdevice_13000"] = gpa("cuCtxGetDevice", 13000)[1] == addr("cuCtxGetDevice_v2")
        out["ctxcreate_13000"] = gpa("cuCtxCreate", 13000)[1] == addr("cuCtxCreate_v4")
        out["streamsync_ptsz"] = gpa("cuStreamSynchronize", 13000, 2)[1] == addr("cuStreamSynchronize_ptsz")
        out["unknown_v2"] = gpa("cuNoSuchFunction", 13000)
        out["unknown_v1"] = gpa("cuNoSuchFunction", 13000, v1=True)
        out["too_low_v2"] = gpa("cuMemAllocAsync", 11010)
        out["too_low_v1"] = gpa("cuMemAllocAsync", 11010, v1=True)
        out["too_new"] = gpa("cuMemAlloc", 13010)
        out["bad_flags"] = gpa("cuMemAlloc", 13000, 4)
        out["null_status"] = gpa("cuMemAlloc", 13000, null_status=True)[:2] == (0, addr("cuMemAlloc_v2"))
        out["null_pfn"] = cu.cuGetProcAddress_v2(b"cuMemAlloc", None, 13000, c_ulonglong(0), None)
        out["export_table"] = cu.cuGetExportTable(byref(c_void_p()), None)
    """,
    )
    for key in (
        "alloc_old",
        "alloc_new",
        "alloc_2000",
        "ipc_4010",
        "ipc_10020",
        "ipc_11000",
        "gpa_11030",
        "gpa_12000",
        "meminfo_old",
        "ctxgetdevice_12000",
        "ctxgetdevice_13000",
        "ctxcreate_13000",
        "streamsync_ptsz",
        "null_status",
    ):
        assert out[key] is True, key
    # as measured on driver 580.159: v2 answers SUCCESS with a NULL pointer and a status ...
    assert out["unknown_v2"] == [0, None, 1]
    assert out["too_low_v2"] == [0, None, 2]
    # ... v1 answers CUDA_ERROR_NOT_FOUND
    assert out["unknown_v1"][:2] == [500, None]
    assert out["too_low_v1"][:2] == [500, None]
    # newer than the driver, or unknown flags: INVALID_VALUE, outputs untouched
    assert out["too_new"] == [1, 12345, -7]
    assert out["bad_flags"] == [1, 12345, -7]
    assert out["null_pfn"] == 1
    assert out["export_table"] == 500


def test_gpa_refuses_versions_above_driver(sim):
    out = run_py(
        sim,
        """
        v = c_int()
        cu.cuDriverGetVersion(byref(v))
        out["version"] = v.value
        out["12080"] = gpa("cuMemAlloc", 12080)[0]
        out["12090"] = gpa("cuMemAlloc", 12090)[0]
    """,
        driver_version=12080,
    )
    assert out == {"version": 12080, "12080": 0, "12090": 1}


def test_gpa_reaches_every_exported_function(sim):
    names = sorted(
        n
        for n in exported_functions(sim.lib / "libcuda.so.1")
        if n.startswith("cu") and not n.startswith("cudasim")
    )
    out = run_py(
        sim,
        f"""
        names = {names!r}
        import re
        versions = [2000, 2020, 3000, 3020, 4000, 4010, 5000, 6000, 7000, 10000, 10020, 11000, 11020,
                    11030, 11040, 12000, 12080, 13000]
        reached = set()
        for base in {{re.sub(r"(_v\\d+)?(_ptsz)?$", "", n) for n in names}}:
            for v in versions:
                for f in (0, 2):
                    r, p, st = gpa(base, v, f)
                    if p:
                        reached.add(p)
        out["missing"] = [n for n in names if addr(n) not in reached]
    """,
    )
    assert out["missing"] == []


def test_gpa_returns_driver_functions_even_when_interposed(sim):
    """A preloaded library exporting cuMemAlloc_v2 gets the program's PLT calls, but the driver's
    cuGetProcAddress must hand out the driver's own function, as a real driver does (-Bsymbolic)."""
    env = sim.env()
    env["LD_PRELOAD"] = str(sim.libinterpose)
    res = sim.run("route_gpa", env=env)
    assert res.returncode == 0, res.stderr
    r = {x["base"]: x for x in simbuild.parse_resolves(res.stdout)}
    assert (
        r["cuMemAlloc"]["library"] == "libcuda.so.1"
        and r["cuMemAlloc"]["symbol"] == "cuMemAlloc_v2"
    )
    assert "# interpose cuMemAlloc_v2 0" in res.stderr
    res = sim.run("route_link", env=env)
    assert res.returncode == 0
    assert "# interpose cuMemAlloc_v2 1" in res.stderr


# ---- the route programs ------------------------------------------------------------------------


@pytest.mark.parametrize("ptsz", [False, True])
def test_route_link(sim, ptsz):
    calls = sim.new_state().with_suffix(".calls")
    res = sim.run("route_link", *(["--ptsz"] if ptsz else []), calls=calls)
    check_route(res, ptsz)
    per = simbuild.parse_calls(calls)
    assert len(per) == 1
    c = next(iter(per.values()))
    assert c["cuMemAlloc_v2"] == 1 and c["cuMemFree_v2"] == 3 and c["cuMemGetInfo_v2"] == 6
    if ptsz:
        assert c["cuMemAllocAsync_ptsz"] == 1 and "cuMemAllocAsync" not in c
        assert c["cuMemFreeAsync_ptsz"] == 2 and "cuMemFreeAsync" not in c
    else:
        assert c["cuMemAllocAsync"] == 1 and "cuMemAllocAsync_ptsz" not in c


@pytest.mark.parametrize("ptsz", [False, True])
def test_route_dlsym(sim, ptsz):
    res = sim.run("route_dlsym", *(["--ptsz"] if ptsz else []))
    check_route(res, ptsz)
    looked = [line.split() for line in res.stdout.splitlines() if line.startswith("dlsym ")]
    assert looked and all(f[1] == f[2] and f[3] == "libcuda.so.1" for f in looked)
    assert ("cuMemAllocAsync_ptsz" in {f[1] for f in looked}) == ptsz


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--ptsz"],
        ["--v1"],
        ["--legacy", "--old-abi"],
        ["--ptsz", "--old-abi", "--runtime-versions"],
        ["--v1", "--ptsz"],
    ],
)
def test_route_gpa(sim, args):
    calls = sim.new_state().with_suffix(".calls")
    res = sim.run("route_gpa", *args, calls=calls)
    ptsz = "--ptsz" in args
    check_route(res, ptsz, old_abi="--old-abi" in args)
    resolves = simbuild.parse_resolves(res.stdout)
    assert resolves[0]["base"] == "cuGetProcAddress"
    assert resolves[0]["symbol"] == (
        "cuGetProcAddress" if "--v1" in args else "cuGetProcAddress_v2"
    )
    assert all(x["result"] == 0 and x["library"] == "libcuda.so.1" for x in resolves)
    by_base = {}
    for x in resolves:
        by_base.setdefault(x["base"], x)
    assert by_base["cuMemAllocAsync"]["symbol"] == (
        "cuMemAllocAsync_ptsz" if ptsz else "cuMemAllocAsync"
    )
    assert by_base["cuInit"]["symbol"] == "cuInit"
    if "--runtime-versions" in args:
        assert by_base["cuMemAlloc"]["version"] == 3020
    c = next(iter(simbuild.parse_calls(calls).values()))
    entry = "cuGetProcAddress" if "--v1" in args else "cuGetProcAddress_v2"
    assert c[entry] >= 45
    assert ("cuMemAllocAsync_ptsz" in c) == ptsz and ("cuMemAllocAsync" in c) == (not ptsz)
    if "--old-abi" in args:
        assert c["cuMemAlloc"] == 1 and c["cuMemFree"] == 1


def test_route_integrated_counts_pinned_host(sim):
    res = sim.run("route_link", integrated=True)
    check_route(res, False, integrated=True)


def test_route_pointers_are_fake_and_host_memory_real(sim):
    got = ops(sim.run("route_link", check=True))
    dev = [o.ptr for o in got if o.api == "cuMemAlloc_v2"][0]
    assert dev >= 0x100000000000 and dev % (2 * MiB) == 0
    host = [o.ptr for o in got if o.api == "cuMemHostAlloc"][0]
    assert host % 4096 == 0  # written by the program: a real allocation


# ---- device accounting, one process --------------------------------------------------------------


def test_errors_and_edge_cases(sim):
    out = run_py(
        sim,
        """
        p = c_ulonglong()
        out["before_init"] = cu.cuMemAlloc_v2(byref(p), c_size_t(1))
        out["meminfo_before_init"] = cu.cuMemGetInfo_v2(None, None)
        out["init_flags"] = cu.cuInit(1)
        out["init"] = cu.cuInit(0)
        out["zero"] = cu.cuMemAlloc_v2(byref(p), c_size_t(0))
        out["null_out"] = cu.cuMemAlloc_v2(None, c_size_t(4096))
        out["free_unknown"] = cu.cuMemFree_v2(c_ulonglong(0x123456789000))
        out["free_null"] = cu.cuMemFree_v2(c_ulonglong(0))
        r, ptr = alloc(MiB := 1 << 20)
        out["free_ok"] = cu.cuMemFree_v2(c_ulonglong(ptr))
        out["double_free"] = cu.cuMemFree_v2(c_ulonglong(ptr))
        out["oom"] = alloc(17 << 30)[0]
        out["used_after"] = stats()[0]
        out["meminfo_nulls"] = cu.cuMemGetInfo_v2(None, None)
        t = c_size_t()
        out["meminfo_total_only"] = [cu.cuMemGetInfo_v2(None, byref(t)), t.value]
        pitch = c_size_t()
        out["pitch"] = [cu.cuMemAllocPitch_v2(byref(p), byref(pitch), c_size_t(100), c_size_t(10), 4), pitch.value]
        out["pitch_es3"] = cu.cuMemAllocPitch_v2(byref(p), byref(pitch), c_size_t(100), c_size_t(10), 3)
        out["managed_flags0"] = cu.cuMemAllocManaged(byref(p), c_size_t(4096), 0)
        hp = c_void_p(1)
        out["hostalloc0"] = [cu.cuMemHostAlloc(byref(hp), c_size_t(0), 0), hp.value]
        out["freehost_null"] = cu.cuMemFreeHost(None)
        out["freehost_unknown"] = cu.cuMemFreeHost(c_void_p(0x1000))
        out["async0"] = [cu.cuMemAllocAsync(byref(p), c_size_t(0), None), p.value]
        out["async_bad_stream"] = cu.cuMemAllocAsync(byref(p), c_size_t(4096), c_void_p(0xdead000))
        out["array_destroy_unknown"] = cu.cuArrayDestroy(c_void_p(0x1000))
        name = c_char_p()
        out["errname"] = [cu.cuGetErrorName(2, byref(name)), name.value.decode()]
        out["errname_bad"] = cu.cuGetErrorName(12345, byref(name))
        attr = c_int(-1)
        cu.cuDeviceGetAttribute(byref(attr), 18, 0)
        out["integrated"] = attr.value
    """,
    )
    assert out["before_init"] == 3 and out["meminfo_before_init"] == 3
    assert out["init_flags"] == 1 and out["init"] == 0
    assert out["zero"] == 1 and out["null_out"] == 1
    assert out["free_unknown"] == 1 and out["free_null"] == 0
    assert out["free_ok"] == 0 and out["double_free"] == 1
    assert out["oom"] == 2 and out["used_after"] == 0
    assert out["meminfo_nulls"] == 0 and out["meminfo_total_only"] == [0, DEFAULT_TOTAL]
    assert out["pitch"] == [0, 512] and out["pitch_es3"] == 1
    assert out["managed_flags0"] == 1
    assert (
        out["hostalloc0"] == [0, None]
        and out["freehost_null"] == 0
        and out["freehost_unknown"] == 1
    )
    assert out["async0"] == [0, 0] and out["async_bad_stream"] == 400
    assert out["array_destroy_unknown"] == 400
    assert out["errname"] == [0, "CUDA_ERROR_OUT_OF_MEMORY"] and out["errname_bad"] == 1
    assert out["integrated"] == 0


def test_vmm_release_keeps_memory_until_last_unmap(sim):
    out = run_py(
        sim,
        """
        cu.cuInit(0)
        class Prop(ctypes.Structure):
            _fields_ = [("type", c_int), ("handleTypes", c_int), ("loctype", c_int), ("id", c_int),
                        ("meta", c_void_p), ("flags", ctypes.c_ubyte * 8)]
        prop = Prop(1, 0, 1, 0)
        h = c_ulonglong()
        out["unaligned"] = cu.cuMemCreate(byref(h), c_size_t(3 << 20), byref(prop), c_ulonglong(0))
        out["create"] = cu.cuMemCreate(byref(h), c_size_t(4 << 20), byref(prop), c_ulonglong(0))
        out["after_create"] = stats()[0]
        va = c_ulonglong()
        out["reserve"] = cu.cuMemAddressReserve(byref(va), c_size_t(16 << 20), c_size_t(0), c_ulonglong(0), c_ulonglong(0))
        out["after_reserve"] = stats()[0]
        out["map1"] = cu.cuMemMap(va, c_size_t(4 << 20), c_size_t(0), h, c_ulonglong(0))
        out["map2"] = cu.cuMemMap(c_ulonglong(va.value + (8 << 20)), c_size_t(4 << 20), c_size_t(0), h, c_ulonglong(0))
        out["overlap"] = cu.cuMemMap(va, c_size_t(2 << 20), c_size_t(0), h, c_ulonglong(0))
        out["release"] = cu.cuMemRelease(h)
        out["after_release"] = stats()[0]
        out["release_again"] = cu.cuMemRelease(h)
        out["unmap_partial"] = cu.cuMemUnmap(va, c_size_t(2 << 20))
        out["unmap1"] = cu.cuMemUnmap(va, c_size_t(4 << 20))
        out["after_unmap1"] = stats()[0]
        out["unmap2"] = cu.cuMemUnmap(c_ulonglong(va.value + (8 << 20)), c_size_t(4 << 20))
        out["after_unmap2"] = stats()[0]
        out["addrfree_wrong"] = cu.cuMemAddressFree(va, c_size_t(4 << 20))
        out["addrfree"] = cu.cuMemAddressFree(va, c_size_t(16 << 20))
        out["hwm"] = stats()[1]
    """,
    )
    assert out["unaligned"] == 1 and out["create"] == 0
    assert out["after_create"] == 4 * MiB and out["after_reserve"] == 4 * MiB
    assert out["map1"] == 0 and out["map2"] == 0 and out["overlap"] == 1
    assert out["release"] == 0 and out["after_release"] == 4 * MiB and out["release_again"] == 1
    assert out["unmap_partial"] == 1
    assert out["unmap1"] == 0 and out["after_unmap1"] == 4 * MiB
    assert out["unmap2"] == 0 and out["after_unmap2"] == 0
    assert out["addrfree_wrong"] == 1 and out["addrfree"] == 0
    assert out["hwm"] == 4 * MiB


def test_graph_destroy_returns_unfreed_node_memory(sim):
    out = run_py(
        sim,
        """
        cu.cuInit(0)
        g = c_void_p()
        cu.cuGraphCreate(byref(g), 0)
        class Params(ctypes.Structure):
            _fields_ = [("allocType", c_int), ("handleTypes", c_int), ("loctype", c_int), ("id", c_int),
                        ("sec", c_void_p), ("maxSize", c_size_t), ("usage", ctypes.c_ushort),
                        ("reserved", ctypes.c_ubyte * 54), ("accessDescs", c_void_p),
                        ("accessDescCount", c_size_t), ("bytesize", c_size_t), ("dptr", c_ulonglong)]
        np = Params(allocType=1, loctype=1, id=0, bytesize=8 << 20)
        node = c_void_p()
        out["add"] = cu.cuGraphAddMemAllocNode(byref(node), g, None, c_size_t(0), byref(np))
        out["dptr"] = np.dptr
        out["used"] = stats()[0]
        out["cuMemFree"] = cu.cuMemFree_v2(c_ulonglong(np.dptr))
        out["destroy"] = cu.cuGraphDestroy(g)
        out["after"] = stats()[0]
    """,
    )
    assert out["add"] == 0 and out["dptr"] and out["used"] == 8 * MiB
    assert out["cuMemFree"] == 1  # graph memory is not the program's to cuMemFree before a launch
    assert out["destroy"] == 0 and out["after"] == 0


def test_multiple_devices_and_contexts(sim):
    out = run_py(
        sim,
        """
        cu.cuInit(0)
        n = c_int()
        cu.cuDeviceGetCount(byref(n))
        out["count"] = n.value
        d = c_int()
        out["bad_device"] = cu.cuDeviceGet(byref(d), 2)
        tm = c_size_t()
        cu.cuDeviceTotalMem_v2(byref(tm), 1)
        out["total1"] = tm.value
        dev = c_int(-1)
        cu.cuCtxGetDevice(byref(dev))
        out["default_dev"] = dev.value
        ctx = c_void_p()
        out["create"] = cu.cuCtxCreate_v2(byref(ctx), 0, 1)
        cu.cuCtxGetDevice(byref(dev))
        out["dev_after_create"] = dev.value
        r, p = alloc(3 << 20)
        out["alloc"] = r
        out["meminfo"] = meminfo()
        out["stats1"] = stats(1)[0]
        out["stats0"] = stats(0)[0]
        cur = c_void_p()
        cu.cuCtxGetCurrent(byref(cur))
        out["current_is_created"] = cur.value == ctx.value
        prim = c_void_p()
        cu.cuDevicePrimaryCtxRetain(byref(prim), 0)
        cu.cuCtxSetCurrent(prim)
        cu.cuCtxGetDevice(byref(dev))
        out["dev_after_set"] = dev.value
        out["free_other_ctx"] = cu.cuMemFree_v2(c_ulonglong(p))
        out["stats1_after"] = stats(1)[0]
        out["setnull"] = cu.cuCtxSetCurrent(None)
        out["alloc_no_ctx"] = alloc(4096)[0]
        name = ctypes.create_string_buffer(64)
        cu.cuDeviceGetName(name, 64, 1)
        out["name"] = name.value.decode()
    """,
        devices=2,
        total_bytes=[GiB, 2 * GiB],
    )
    assert out["count"] == 2 and out["bad_device"] == 101 and out["total1"] == 2 * GiB
    assert out["default_dev"] == 0 and out["create"] == 0 and out["dev_after_create"] == 1
    assert out["alloc"] == 0 and out["meminfo"] == [0, 2 * GiB - 3 * MiB, 2 * GiB]
    assert out["stats1"] == 3 * MiB and out["stats0"] == 0 and out["current_is_created"]
    assert out["dev_after_set"] == 0
    assert out["free_other_ctx"] == 0 and out["stats1_after"] == 0
    assert out["setnull"] == 0 and out["alloc_no_ctx"] == 201
    assert out["name"] == "cudasim discrete device 1"


def test_strict_context(sim):
    out = run_py(
        sim,
        """
        cu.cuInit(0)
        out["no_ctx"] = alloc(4096)[0]
        cur = c_void_p(1)
        cu.cuCtxGetCurrent(byref(cur))
        out["current"] = cur.value
        ctx = c_void_p()
        cu.cuDevicePrimaryCtxRetain(byref(ctx), 0)
        cu.cuCtxSetCurrent(ctx)
        out["with_ctx"] = alloc(4096)[0]
    """,
        strict_context=True,
    )
    assert out == {"no_ctx": 201, "current": None, "with_ctx": 0}


def test_fail_nth(sim):
    res = sim.run("hold", "--exit-after-ms", 0, "--free", 4, "1m", fail_nth=3)
    assert res.returncode == 1
    got = [(o.op, o.result) for o in ops(res)]
    assert got == [
        ("alloc", 0),
        ("alloc", 0),
        ("alloc", 2),
        ("alloc", 0),
        ("free", 0),
        ("free", 0),
        ("free", 0),
    ]


def test_ctx_bytes_is_hidden_context_cost(sim):
    state = sim.new_state()
    res = sim.run("meminfo", "--alloc", "64m", state=state, ctx_bytes=300 * MiB)
    assert res.returncode == 0, res.stdout
    got = ops(res)
    assert [o.api for o in got if o.op != "meminfo"] == ["cuMemAlloc_v2", "cuMemFree_v2"]
    info = got[1]
    assert (info.size, info.ptr) == (DEFAULT_TOTAL, DEFAULT_TOTAL - 364 * MiB)
    procs = re.findall(r"# nvml process (\d+) (\d+)", res.stdout)
    assert len(procs) == 1 and int(procs[0][1]) == 364 * MiB
    assert sim.stats(state)[0]["used"] == 0  # it exited: all of it went back


# ---- shared accounting across processes ----------------------------------------------------------


def test_state_shared_across_processes_and_reclaimed_after_kill(sim):
    state = sim.new_state()
    hold = popen(sim, "hold", 3, "100m", state=state)
    try:
        lines = wait_ready(hold)
        assert [o.result for o in simbuild.parse_ops("\n".join(lines))] == [0, 0, 0]
        st = sim.stats(state)[0]
        assert st["used"] == 300 * MiB and st["pids"] == {
            hold.pid: {"used": 300 * MiB, "hwm": 300 * MiB}
        }
        res = sim.run("meminfo", "--alloc", "50m", state=state)
        assert res.returncode == 0, res.stdout
        got = ops(res)
        link = [o for o in got if o.api == "cuMemGetInfo_v2"][0]
        assert (link.size, link.ptr) == (DEFAULT_TOTAL, DEFAULT_TOTAL - 350 * MiB)
        nv = [o for o in got if o.api == "nvmlDeviceGetMemoryInfo"][0]
        assert (nv.size, nv.ptr, nv.result) == (DEFAULT_TOTAL, DEFAULT_TOTAL - 350 * MiB, 0)
        procs = {int(p): int(u) for p, u in re.findall(r"# nvml process (\d+) (\d+)", res.stdout)}
        assert procs[hold.pid] == 300 * MiB and len(procs) == 2
        assert "# nvml used %d" % (350 * MiB) in res.stdout
    finally:
        hold.kill()
        hold.wait()
    st = sim.stats(state)[0]
    assert st["used"] == 0 and st["pids"] == {}
    assert st["hwm"] == 350 * MiB


def test_clean_exit_and_leak_give_memory_back(sim):
    state = sim.new_state()
    res = sim.run("hold", "--exit-after-ms", 0, 2, "10m", state=state)  # leaks at exit
    assert res.returncode == 0
    st = sim.stats(state)[0]
    assert st["used"] == 0 and st["hwm"] == 20 * MiB


def test_out_of_memory_changes_nothing(sim):
    state = sim.new_state()
    res = sim.run("hold", "--exit-after-ms", 0, "--free", 3, "40m", state=state, total_bytes="100m")
    assert res.returncode == 1
    got = ops(res)
    assert [(o.op, o.result) for o in got] == [
        ("alloc", 0),
        ("alloc", 0),
        ("alloc", 2),
        ("free", 0),
        ("free", 0),
    ]
    assert got[2].ptr == 0
    st = sim.stats(state)[0]
    assert st["total"] == 100 * MiB and st["used"] == 0 and st["hwm"] == 80 * MiB


def test_high_water_mark_across_processes(sim):
    state = sim.new_state()
    a = popen(sim, "hold", 1, "200m", state=state)
    b = popen(sim, "hold", 2, "100m", state=state)
    try:
        wait_ready(a)
        wait_ready(b)
        st = sim.stats(state)[0]
        assert st["used"] == 400 * MiB and set(st["pids"]) == {a.pid, b.pid}
    finally:
        for p in (a, b):
            p.send_signal(signal.SIGTERM)
            p.wait()
    st = sim.stats(state)[0]
    assert st["used"] == 0 and st["hwm"] == 400 * MiB


def test_processes_hammering_one_device(sim):
    state = sim.new_state()
    # 7 MiB buffers: one thread holding 4 wants 28 MiB of the 24, so OOM comes even without overlap
    procs = [
        popen(sim, "budget_hammer", 8, 300, "7m", state=state, total_bytes="24m") for _ in range(4)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        results.append((p.returncode, out))
    oom = ok = 0
    for rc, out in results:
        assert rc == 0, out
        m = re.search(r"ok (\d+) oom (\d+)", out)
        assert m, out
        ok += int(m[1])  # one process may get nothing while the others hold the device
        oom += int(m[2])
    assert ok > 0 and oom > 0
    st = sim.stats(state)[0]
    assert st["used"] == 0 and st["hwm"] == 21 * MiB


def test_threads(sim):
    state = sim.new_state()
    res = sim.run("threads", 16, 2000, "1m", state=state)
    assert res.returncode == 0 and res.stdout.strip() == "done allocs 32000 frees 32000"
    st = sim.stats(state)[0]
    assert st["used"] == 0 and MiB <= st["hwm"] <= 16 * MiB


def test_budget_hammer_single_process(sim):
    res = sim.run("budget_hammer", 16, 1000, "3m", total_bytes="8m")
    assert res.returncode == 0, res.stdout
    m = re.fullmatch(r"ok (\d+) oom (\d+)", res.stdout.strip())
    assert m and int(m[1]) > 0 and int(m[2]) > 0


def test_forkexec_tree(sim):
    state = sim.new_state()
    calls = sim.new_state().with_suffix(".calls")
    res = sim.run("forkexec", "--fork-child", 2, state=state, calls=calls)
    assert res.returncode == 0, res.stdout + res.stderr
    heads = re.findall(r"# forkexec pid (\d+) ppid (\d+) depth (\d+) mode (\w+)", res.stdout)
    assert [(d, m) for _, _, d, m in heads] == [
        ("2", "top"),
        ("2", "fork"),
        ("1", "exec"),
        ("0", "exec"),
    ]
    pids = [int(p) for p, _, _, _ in heads]
    assert len(set(pids)) == 4
    assert (
        int(heads[1][1]) == pids[0] and int(heads[2][1]) == pids[0] and int(heads[3][1]) == pids[2]
    )
    got = ops(res)
    assert (
        len([o for o in got if o.op == "alloc"]) == 4
        and len([o for o in got if o.op == "free"]) == 4
    )
    assert all(o.result == 0 and o.size == MiB for o in got)
    assert "# forkexec done status 0" in res.stdout
    st = sim.stats(state)[0]
    assert st["used"] == 0 and st["hwm"] == 3 * MiB  # three images of the chain hold 1 MiB at once
    per = simbuild.parse_calls(calls)
    assert set(per) == set(pids) and all(c["cuMemAlloc_v2"] == 1 for c in per.values())


def test_forkexec_exit_status_propagates(sim):
    res = sim.run("forkexec", 0)
    assert res.returncode == 0 and len(ops(res)) == 2


# ---- NVML ----------------------------------------------------------------------------------------


def test_meminfo_program(sim):
    res = sim.run("meminfo", "--alloc", "1g")
    assert res.returncode == 0, res.stdout
    got = ops(res)
    free = DEFAULT_TOTAL - GiB
    cu = [o for o in got if o.api == "cuMemGetInfo_v2"]
    assert len(cu) == 8
    assert [(o.size, o.ptr) for o in cu] == [
        (DEFAULT_TOTAL, free),
        (DEFAULT_TOTAL, None),
        (None, free),
        (None, None),
    ] * 2
    nv = [(o.api, o.size, o.ptr, o.result) for o in got if o.api.startswith("nvml")]
    assert nv == [
        ("nvmlDeviceGetMemoryInfo", DEFAULT_TOTAL, free, 0),
        ("nvmlDeviceGetMemoryInfo", None, None, 2),
        ("nvmlDeviceGetMemoryInfo_v2", DEFAULT_TOTAL, free, 0),
        ("nvmlDeviceGetMemoryInfo_v2", None, None, 13),
        ("nvmlDeviceGetMemoryInfo_v2", None, None, 2),
    ]
    assert "# nvml_v2 used %d reserved 0" % GiB in res.stdout
    r = simbuild.parse_resolves(res.stdout)
    assert r[0]["symbol"] == "cuMemGetInfo_v2" and r[0]["library"] == "libcuda.so.1"


def test_nvml_integrated_not_supported(sim):
    res = sim.run("meminfo", integrated=True)
    assert res.returncode == 0, res.stdout
    nv = [o.result for o in ops(res) if o.api.startswith("nvml")]
    assert nv[0] == 3 and nv[2] == 3


def test_nvml_api_details(sim):
    out = run_py(
        sim,
        """
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        d = c_void_p()
        out["uninit"] = nv.nvmlDeviceGetHandleByIndex_v2(0, byref(d))
        out["init"] = nv.nvmlInit_v2()
        n = c_uint()
        nv.nvmlDeviceGetCount_v2(byref(n))
        out["count"] = n.value
        out["bad_index"] = nv.nvmlDeviceGetHandleByIndex_v2(3, byref(d))
        nv.nvmlDeviceGetHandleByIndex_v2(1, byref(d))
        class Mem2(ctypes.Structure):
            _fields_ = [("version", c_uint), ("total", c_ulonglong), ("reserved", c_ulonglong),
                        ("free", c_ulonglong), ("used", c_ulonglong)]
        m = Mem2(version=ctypes.sizeof(Mem2) | (2 << 24))
        out["v2"] = [nv.nvmlDeviceGetMemoryInfo_v2(d, byref(m)), m.total, m.free, m.used]
        cnt = c_uint(0)
        out["procs_query"] = [nv.nvmlDeviceGetComputeRunningProcesses_v3(d, byref(cnt), None), cnt.value]
        buf = ctypes.create_string_buffer(128)
        out["driver"] = [nv.nvmlSystemGetDriverVersion(buf, 128), buf.value.decode()]
        out["driver_short"] = nv.nvmlSystemGetDriverVersion(buf, 3)
        nv.nvmlErrorString.restype = c_char_p
        out["errstr"] = nv.nvmlErrorString(7).decode()
        out["shutdown"] = [nv.nvmlShutdown(), nv.nvmlShutdown()]
    """,
        devices=2,
        total_bytes=[GiB, 3 * GiB],
    )
    assert out["uninit"] == 1 and out["init"] == 0 and out["count"] == 2 and out["bad_index"] == 2
    assert out["v2"] == [0, 3 * GiB, 3 * GiB, 0]
    assert out["procs_query"] == [0, 0]
    assert (
        out["driver"][0] == 0 and out["driver"][1].startswith("580.") and out["driver_short"] == 7
    )
    assert out["errstr"] == "Insufficient Size" and out["shutdown"] == [0, 1]


def test_nvml_sees_in_process_driver_state_without_state_file(sim):
    out = run_py(
        sim,
        """
        cu.cuInit(0)
        r, p = alloc(5 << 20)
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        nv.nvmlInit_v2()
        d = c_void_p()
        nv.nvmlDeviceGetHandleByIndex_v2(0, byref(d))
        class Mem(ctypes.Structure):
            _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]
        m = Mem()
        out["mem"] = [nv.nvmlDeviceGetMemoryInfo(d, byref(m)), m.used]
    """,
    )
    assert out["mem"] == [0, 5 * MiB]


# ---- the other programs --------------------------------------------------------------------------


def test_exitcode(sim):
    assert sim.run("exitcode", 0).returncode == 0
    assert sim.run("exitcode", 7).returncode == 7
    assert sim.run("exitcode", "--signal", 15).returncode == -15
    p = popen(sim, "exitcode", "--sleep")
    try:
        wait_ready(p)
        p.send_signal(signal.SIGUSR1)
        out, _ = p.communicate(timeout=20)
    finally:
        p.kill()
    assert out.strip() == "got signal 10" and p.returncode == 0x40 + 10


def test_dlsym_next(sim):
    res = sim.run("dlsym_next")
    assert (
        res.returncode == 0 and "via libnext no" in res.stdout and res.stdout.strip().endswith("ok")
    )
    env = sim.env()
    env["LD_PRELOAD"] = str(sim.libnext)
    res = sim.run("dlsym_next", env=env)
    assert res.returncode == 0, res.stdout
    assert "via libnext yes" in res.stdout and "next libc.so.6" in res.stdout
    assert res.stdout.strip().endswith("ok")


def test_static_prog(sim):
    assert sim.progs["static_prog"] is not None, "no static C library here (libc6-dev)"
    res = sim.run("static_prog", 3)
    assert res.returncode == 3 and res.stdout.startswith("static ok pid")
    hdr = subprocess.run(
        ["readelf", "-l", str(sim.progs["static_prog"])], capture_output=True, text=True
    ).stdout
    assert "INTERP" not in hdr


def test_hold_exit_after_ms(sim):
    res = sim.run("hold", "--exit-after-ms", 50, "--free", 2, "1m", check=True)
    assert [o.op for o in ops(res)] == ["alloc", "alloc", "free", "free"] and "ready" in res.stdout


def test_program_functions_are_named(sim):
    """Stack addresses must resolve to the named, non-inlined functions of each program."""
    want = {
        "route_link": [
            "do_alloc_device",
            "do_alloc_pitch",
            "do_alloc_async",
            "do_vmm_create",
            "do_free_device",
        ],
        "route_gpa": ["do_alloc_device", "do_alloc_old_abi", "do_alloc_graph"],
        "route_dlsym": ["do_alloc_managed", "do_alloc_hostalloc"],
        "threads": ["thread_alloc", "thread_free"],
        "hold": ["hold_alloc"],
        "forkexec": ["forkexec_alloc", "forkchild_alloc"],
        "budget_hammer": ["hammer_alloc", "hammer_free"],
        "meminfo": ["meminfo_link", "meminfo_gpa", "meminfo_nvml"],
    }
    for prog, funcs in want.items():
        dyn = subprocess.run(
            ["nm", "-D", "--defined-only", str(sim.progs[prog])],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        names = {line.split()[-1] for line in dyn.splitlines()}
        assert set(funcs) <= names, (prog, set(funcs) - names)


def test_exec_gives_the_replaced_image_memory_back(sim):
    """exec replaces a process image without an exit: its device memory goes with it, as a real
    driver's does (the next image of the same pid finds and releases it)."""
    state = sim.new_state()
    script = PRELUDE + textwrap.dedent(f"""
        import os, subprocess
        cu.cuInit(0)
        assert alloc(40 << 20)[0] == 0
        seen = subprocess.run([{str(sim.progs["simstat"])!r}], capture_output=True, text=True).stdout
        print(seen, flush=True)
        os.execv({str(sim.progs["simstat"])!r}, ["simstat"])
    """)
    res = subprocess.run(
        [sys.executable, "-c", script],
        env=sim.env(state=state),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    before, after = res.stdout.split("\n\n", 1)
    assert simbuild.parse_simstat(before)[0]["used"] == 40 * MiB
    st = simbuild.parse_simstat(after)[0]
    assert st["used"] == 0 and st["pids"] == {} and st["hwm"] == 40 * MiB
