"""A Python program's denial: the shim's line names the Python line `report` names
(docs/python-frames.md, docs/attribution.md), under `cudatrace run --budget` and under a bare
LD_PRELOAD with CUDATRACE_GROUP and CUDATRACE_BUDGET (no launcher), with and without -q;
where the shim cannot read the frames its line says so, never naming ctypes' native code as the
site. Every CPython here (support/pyprogs.py), on the simulated driver."""

from __future__ import annotations

import _ctypes
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from cudatrace import native
from support.pyprogs import (
    INTERPRETERS,
    OLDER_INTERPRETERS,
    PRELUDE,
    lines_of,
    site_packages,
)

# a helper both callers allocate through (an allocator layer once both have called it): the
# weights fit the budget, the third KV layer does not
LAYERED = (
    PRELUDE
    + r"""
def load_weights():
    out = []
    for _ in range(2):
        out.append(device_alloc(64 << 20))  # LINE:weights
    return out

def kv_cache(layers):
    out = []
    for _ in range(layers):
        out.append(device_alloc(32 << 20))  # LINE:kv
    return out

def main():
    load_weights()
    kv_cache(8)  # LINE:main

try:
    main()
except AssertionError:
    sys.exit(3)
"""
)

# an installed framework's API (site-packages: fakefw over fakefwlib, json between them)
# called from the program's own function, once
FRAMEWORK = r"""
import sys
import fakefw

def kv_cache(layers):
    out = []
    for _ in range(layers):
        out.append(fakefw.empty(48 << 20))  # LINE:kv
    return out

try:
    kv_cache(8)
except AssertionError:
    sys.exit(3)
"""

BUDGET = "200MiB"
SITE = re.compile(r"; at (.+?)(?: via |, called from |; )")


def shim_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if "cudatrace: budget exceeded" in x]
    assert len(lines) == 1, stderr
    return lines[0]


def shim_site(stderr: str) -> str:
    m = SITE.search(shim_line(stderr))
    assert m, stderr
    return m.group(1)


def report_denied(ct, out: Path, env=None) -> list[str]:
    r = ct.cli("report", out, "--json", env=env)
    assert r.returncode == 0, r.stderr
    return [d["label"] for d in json.loads(r.stdout)["denied"]]


def write(tmp_path: Path, src: str) -> Path:
    prog = tmp_path / "prog.py"
    prog.write_text(src)
    return prog


def bare_env(ct, tmp_path: Path, trace: Path | None, quiet: bool, **extra) -> dict:
    """The environment an integration sets without the launcher: the preload library, a group
    and its budget (and a trace directory when one is asked for)."""
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir(mode=0o700, exist_ok=True)
    env = ct.env()
    env.update(
        LD_PRELOAD=str(native.shim_path()),
        CUDATRACE_LEDGER_DIR=str(ledgers),
        CUDATRACE_GROUP="pyden" + str(os.getpid()),
        CUDATRACE_BUDGET=BUDGET,
        **extra,
    )
    if trace is not None:
        trace.mkdir()
        env["CUDATRACE_DIR"] = str(trace)
    if quiet:
        env["CUDATRACE_QUIET"] = "1"
    return env


def run_bare(exe: str, prog: Path, env: dict) -> subprocess.CompletedProcess:
    r = subprocess.run([exe, str(prog)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    return r


@pytest.mark.parametrize("quiet", [False, True], ids=["loud", "q"])
@pytest.mark.parametrize("exe", INTERPRETERS)
def test_run_budget_names_the_python_line(ct, exe, tmp_path, quiet):
    prog = write(tmp_path, LAYERED)
    L = lines_of(LAYERED)
    q = ["-q"] if quiet else []
    r = ct.run([exe, prog], *q, "--budget", BUDGET)
    assert r.returncode == 3, r.stderr
    want = "kv_cache (prog.py:%d)" % L["kv"]
    assert report_denied(ct, r.out) == [want]
    line = shim_line(r.stderr)
    assert shim_site(r.stderr) == want, line
    assert (
        "; at %s via device_alloc, called from main (prog.py:%d) <- <module>"
        % (
            want,
            L["main"],
        )
        in line
    ), line
    assert "_ctypes" not in line and "ffi_call" not in line, line
    launcher = [x for x in r.stderr.splitlines() if "cudatrace: denied" in x]
    assert launcher and " at %s via device_alloc;" % want in launcher[0], r.stderr
    assert ("cudatrace: tracing" in r.stderr) != quiet, r.stderr


@pytest.mark.parametrize("quiet", [False, True], ids=["loud", "q"])
@pytest.mark.parametrize("exe", INTERPRETERS)
def test_bare_preload_names_the_python_line(ct, exe, tmp_path, quiet):
    """No launcher: the shim's line alone, the trace it writes read by `report` after."""
    prog = write(tmp_path, LAYERED)
    trace = tmp_path / "trace"
    r = run_bare(exe, prog, bare_env(ct, tmp_path, trace, quiet))
    want = "kv_cache (prog.py:%d)" % lines_of(LAYERED)["kv"]
    assert shim_site(r.stderr) == want, r.stderr
    assert report_denied(ct, trace) == [want]


def test_bare_preload_without_a_trace_names_a_python_line(ct, tmp_path):
    """Without a trace nothing is recorded to show the helper is a layer: the line names the
    innermost Python frame of the program, the helper, with the code that called it after it."""
    prog = write(tmp_path, LAYERED)
    L = lines_of(LAYERED)
    r = run_bare(sys.executable, prog, bare_env(ct, tmp_path, None, True))
    line = shim_line(r.stderr)
    assert (
        "; at device_alloc (prog.py:%d), called from kv_cache (prog.py:%d) <- main (prog.py:%d)"
        % (L["helper"], L["kv"], L["main"])
        in line
    ), line


@pytest.mark.parametrize("exe", INTERPRETERS)
def test_framework_api_folds_under_the_program_line(ct, exe, tmp_path):
    """An installed framework's Python API (and the standard library inside it) is how the
    program's line asked: the shim's line names that line, as the report does."""
    env = ct.env()
    env["PYTHONPATH"] = str(site_packages(tmp_path)) + os.pathsep + env["PYTHONPATH"]
    prog = write(tmp_path, FRAMEWORK)
    want = "kv_cache (prog.py:%d)" % lines_of(FRAMEWORK)["kv"]
    r = ct.run([exe, prog], "--budget", BUDGET, env=env)
    assert r.returncode == 3, r.stderr
    assert report_denied(ct, r.out, env=env) == [want]
    line = shim_line(r.stderr)
    assert shim_site(r.stderr) == want, line
    via = line.split(" via ", 1)[1].split(", called from", 1)[0].split(" > ")
    assert via[0] == "empty" and via[-2:] == ["malloc", "device_alloc"], line
    assert "JSONDecoder.decode" in via, line


TWO_SITES = (
    PRELUDE
    + r"""
def grow_kv():
    p = ctypes.c_uint64()
    for _ in range(5):
        cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 30))  # LINE:kv

def scratch():
    p = ctypes.c_uint64()
    for _ in range(2):
        cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 30))  # LINE:scratch

grow_kv()
scratch()
"""
)


def test_lines_are_rate_limited_per_python_site(ct, tmp_path):
    """Every ctypes call goes through one native call site: the rate limit counts each Python
    site apart (the first three lines of each, then its 10th ...)."""
    prog = write(tmp_path, TWO_SITES)
    L = lines_of(TWO_SITES)
    r = ct.run([sys.executable, prog], "-q", "--budget", BUDGET)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if "cudatrace: budget exceeded" in x]
    sites = [m.group(1) for m in map(SITE.search, lines) if m]
    kv, scratch = "grow_kv (prog.py:%d)" % L["kv"], "scratch (prog.py:%d)" % L["scratch"]
    assert sites == [kv, kv, kv, scratch, scratch], r.stderr
    assert "[3 at this site; further lines only at its 10th, 100th, ...]" in lines[2]


ENGINE_C = r"""
typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *, unsigned long);
__attribute__((noinline)) int device_take(CUdeviceptr *p, unsigned long n)
{
    return cuMemAlloc_v2(p, n);
}
int engine_alloc(CUdeviceptr *p, unsigned long n) { return device_take(p, n) + 0; }
"""

THROUGH_NATIVE = (
    PRELUDE
    + r"""
engine = ctypes.CDLL(sys.argv[1])

def kv_cache(layers):
    for _ in range(layers):
        p = ctypes.c_uint64()
        if engine.engine_alloc(ctypes.byref(p), ctypes.c_size_t(64 << 20)):  # LINE:kv
            sys.exit(3)

kv_cache(8)
"""
)


def test_native_code_under_the_python_line_is_its_via(ct, sim, tmp_path):
    """A native library the Python line called (a binding, an engine's allocator) is how that
    line asked: its frames are the via, Python's call machinery (ctypes, libffi) left out."""
    so = tmp_path / "libengine.so"
    (tmp_path / "engine.c").write_text(ENGINE_C)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O0", "-g", "-o", str(so), str(tmp_path / "engine.c")]
        + [f"-L{sim.lib}", "-lcuda"],
        check=True,
    )
    prog = write(tmp_path, THROUGH_NATIVE)
    want = "kv_cache (prog.py:%d)" % lines_of(THROUGH_NATIVE)["kv"]
    r = ct.run([sys.executable, prog, so], "-q", "--budget", BUDGET)
    assert r.returncode == 3, r.stderr
    assert report_denied(ct, r.out) == [want]
    line = shim_line(r.stderr)
    assert "; at %s via engine_alloc > device_take, called from <module> (prog.py:" % want in line
    launcher = [x for x in r.stderr.splitlines() if "cudatrace: denied" in x]
    assert launcher and " at %s via engine_alloc > device_take;" % want in launcher[0], r.stderr


def function_symbols(path: Path) -> set[str]:
    """The functions of an ELF file's own symbol table (.symtab; none when it is stripped)."""
    with open(path, "rb") as f:
        tab = ELFFile(f).get_section_by_name(".symtab")
        if tab is None:
            return set()
        return {s.name for s in tab.iter_symbols() if s["st_info"]["type"] == "STT_FUNC"}


def test_unread_frames_are_said_not_named(ct, tmp_path):
    """Python frames off: the line says the Python code could not be read and gives the native
    frames up to the interpreter as the raw location, not as the site."""
    prog = write(tmp_path, LAYERED)
    env = ct.env()
    env["CUDATRACE_PYTHON"] = "0"
    r = ct.run([sys.executable, prog], "-q", "--budget", BUDGET, env=env)
    assert r.returncode == 3, r.stderr
    line = shim_line(r.stderr)
    assert (
        "; at Python code whose frames the shim could not read (Python frames are off: "
        "CUDATRACE_PYTHON=0); raw native location, not the site: " in line
    ), line
    raw = line.split("not the site: ", 1)[1].split(";", 1)[0]
    assert raw.endswith("<- _PyEval_EvalFrameDefault"), line
    # ctypes' own frame: named where its module keeps a symbol table, else module+offset (a
    # distribution's _ctypes is stripped; the shim reads the module's .symtab, then .dynsym)
    module = Path(_ctypes.__file__)
    if "_ctypes_callproc" in function_symbols(module):
        assert "_ctypes_callproc" in raw, line
    else:
        assert "<- %s+0x" % module.name in raw and "_ctypes_callproc" not in raw, line
    assert "; at _ctypes_callproc" not in line and " via " not in line, line
    # the same without the launcher
    r = run_bare(sys.executable, prog, bare_env(ct, tmp_path, None, True, CUDATRACE_PYTHON="0"))
    assert "at Python code whose frames the shim could not read" in shim_line(r.stderr)


@pytest.mark.parametrize("exe", OLDER_INTERPRETERS)
def test_unsupported_cpython_is_said(ct, tmp_path, exe):
    prog = write(tmp_path, LAYERED)
    r = ct.run([exe, prog], "--budget", BUDGET)
    assert r.returncode == 3, r.stderr
    line = shim_line(r.stderr)
    assert "at Python code whose frames the shim could not read (CPython older than 3.11" in line
    assert "raw native location, not the site: " in line, line


# comprehensions: a list comprehension is a function of its own before CPython 3.12 and inlined
# from 3.12 on; a generator expression keeps a frame in every version
COMPREHENSIONS = (
    PRELUDE
    + r"""
def scratch(n):
    return list(device_alloc(16 << 20) for _ in range(n))  # LINE:scratch

def kv_cache(layers):
    return [device_alloc(32 << 20) for _ in range(layers)]  # LINE:kv

def main():
    scratch(2)
    kv_cache(8)  # LINE:main

try:
    main()
except AssertionError:
    sys.exit(3)
"""
)


@pytest.mark.parametrize("exe", INTERPRETERS)
def test_comprehensions_are_named_by_their_function(ct, exe, tmp_path):
    """The report, the shim's line and the launcher's name a comprehension's and a generator
    expression's allocations by the function they are written in (never `<listcomp>` or
    `kv_cache.<locals>.<genexpr>`), at the comprehension's line, alike in every version; the
    function's own frame above it is not repeated among the callers."""
    prog = write(tmp_path, COMPREHENSIONS)
    L = lines_of(COMPREHENSIONS)
    r = ct.run([exe, prog], "--budget", BUDGET)
    assert r.returncode == 3, r.stderr
    kv, scratch = "kv_cache (prog.py:%d)" % L["kv"], "scratch (prog.py:%d)" % L["scratch"]
    got = ct.cli("report", r.out, "--json")
    assert got.returncode == 0, got.stderr
    assert {s["label"] for s in json.loads(got.stdout)["sites"]} == {kv, scratch}
    assert report_denied(ct, r.out) == [kv]
    line = shim_line(r.stderr)
    assert shim_site(r.stderr) == kv, line
    assert ", called from main (prog.py:%d) <- <module>" % L["main"] in line, line
    assert "<listcomp>" not in line and "<genexpr>" not in line, line
    launcher = [x for x in r.stderr.splitlines() if "cudatrace: denied" in x]
    assert launcher and " at %s via device_alloc;" % kv in launcher[0], r.stderr
