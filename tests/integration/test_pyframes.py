"""Python frames (docs/python-frames.md): every CPython here, on the simulated driver.

Each test runs for every CPython 3.11-3.13 this machine has (the interpreter running pytest, the
distribution's, python3.X on PATH, pyenv's, those tools/install-test-deps.sh adds:
support/pyprogs.py); a version none is, is skipped with the reason (the running interpreter is
always tested)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudatrace.analyze.documents.analysis import Analysis
from cudatrace.analyze.documents.report import build_report
from cudatrace.analyze.read.trace import C, iter_events, read_dir
from cudatrace.attribution import Attribution
from cudatrace.symbols import python as pyframes
from support.paths import REPO
from support.pyprogs import (
    FAKE_APP,
    INTERPRETERS,
    OLDER_INTERPRETERS,
    PRELUDE,
    lines_of,
    site_packages,
    version_of,
)


def include_dir(exe: str) -> Path:
    out = subprocess.run(
        [exe, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(out)


# ---- the layout tables against CPython's own headers ---------------------------------------
@pytest.mark.parametrize("exe", INTERPRETERS)
def test_layout_table_matches_the_headers(exe, tmp_path):
    inc = include_dir(exe)
    if not (inc / "internal" / "pycore_frame.h").exists():
        pytest.fail(f"{exe} has no internal headers at {inc}: the layout cannot be checked")
    out = tmp_path / "check"
    r = subprocess.run(
        [
            "cc",
            "-std=gnu11",
            "-w",
            f"-I{inc}",
            "-I%s" % (inc / "internal"),
            f"-idirafter{inc.parent}",  # a multiarch pyconfig.h (Debian's), after the system's
            "-I%s" % (REPO / "native" / "include"),
            "-I%s" % (REPO / "native" / "shim"),
            str(REPO / "tests/progs/pylayout_check.c"),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("OK CPython %d.%d" % version_of(exe)), r.stdout


# ---- line tables -------------------------------------------------------------------------
LINES_CHECK = r"""
import importlib.util, sys, types
spec = importlib.util.spec_from_file_location("pyframes", sys.argv[1])
pf = importlib.util.module_from_spec(spec); sys.modules["pyframes"] = pf; spec.loader.exec_module(pf)
import json, email.message, asyncio.base_events, argparse, dataclasses, pathlib, typing
def codes(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from codes(c)
n = bad = 0
for mod in (json, email.message, asyncio.base_events, argparse, dataclasses, pathlib, typing):
    src = open(mod.__file__).read()
    for co in codes(compile(src, mod.__file__, "exec")):
        mine = [(s, e, l) for s, e, l in pf.line_ranges(co.co_linetable, co.co_firstlineno)]
        want = list(co.co_lines())
        # co_lines merges neighbouring entries of one line: compare instruction by instruction
        def per_instr(rs):
            out = {}
            for s, e, l in rs:
                for off in range(s, e, 2):
                    out[off] = l
            return out
        n += 1
        if per_instr(mine) != per_instr(want):
            bad += 1
print(n, bad)
"""


@pytest.mark.parametrize("exe", INTERPRETERS)
def test_line_table_decoder_agrees_with_co_lines(exe):
    r = subprocess.run(
        [exe, "-c", LINES_CHECK, str(REPO / "cudatrace" / "symbols" / "python.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    n, bad = map(int, r.stdout.split())
    assert n > 500 and bad == 0, r.stdout


# ---- programs -----------------------------------------------------------------------------
MAIN = (
    PRELUDE
    + r"""
def kv_cache(layers):
    for _ in range(layers):
        device_alloc(3 << 20)  # LINE:kv

def load_weights():
    return device_alloc(5 << 20)  # LINE:weights

kv_cache(4)  # LINE:call_kv
load_weights()  # LINE:call_weights
"""
)


def run_py(ct, exe, src, tmp_path, *opts, name="prog.py", timeout=120):
    prog = tmp_path / name
    prog.write_text(src)
    r = ct.run([exe, prog], *opts, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r, prog


@pytest.mark.parametrize("exe", INTERPRETERS)
def test_sites_name_the_python_lines(ct, exe, tmp_path):
    r, prog = run_py(ct, exe, MAIN, tmp_path)
    L = lines_of(MAIN)
    td = read_dir(r.out)
    t = td.traces[0]
    major, minor = version_of(exe)
    assert t.info["python.status"] == "ok"
    assert t.info["python.version"].startswith("%d.%d." % (major, minor))
    a = Analysis(r.out, td=td)
    rep = build_report(a)
    assert rep["python"]["allocs_with_frames"] == 5 and rep["python"]["allocs_without_frames"] == {}
    # the Python helper both callers allocate through is an allocator layer: folded into `via`,
    # and each site is named by the Python function that asked (issue 12 with issue 10's fold)
    sites = {s["frames"][0]["function"]: s for s in rep["sites"]}
    assert set(sites) == {"kv_cache", "load_weights"}
    kv, w = sites["kv_cache"], sites["load_weights"]
    assert (kv["bytes"], kv["count"]) == (4 * (3 << 20), 4)
    assert (w["bytes"], w["count"]) == (5 << 20, 1)
    for s, line in ((kv, L["kv"]), (w, L["weights"])):
        (caller,) = s["frames"]
        assert caller["python"] and caller["line"] == line and caller["module"] == str(prog)
        assert caller["file"] == str(prog)
        helper = s["via"][-1]
        assert helper["python"] and helper["function"] == "device_alloc"
        assert helper["line"] == L["helper"] and helper["file"] == str(prog)
    # the merged stack: Python frames in order where the eval loop ran them, above the ctypes
    # call's native frames (folded: interpreter, ctypes, libffi) and outside the interpreter's
    ctx = [f for f in kv["context"] if f["python"]]
    assert [(f["function"], f["line"]) for f in ctx] == [
        ("device_alloc", L["helper"]),
        ("kv_cache", L["kv"]),
        ("<module>", L["call_kv"]),
    ]
    full = a.stacks.all_frames(
        0, next(e["stack"] for e in iter_events(t) if e["op"] == C()["CT_OP_ALLOC"])
    )
    names = [f.function for f in full]
    assert "_PyEval_EvalFrameDefault" not in names  # replaced by the Python frames
    i = names.index("device_alloc")
    assert any(n and ("ffi_call" in n or "PyCFuncPtr_call" in n) for n in names[:i])
    assert any(n and "main" in n.lower() for n in names[i:])  # the interpreter's own start
    # the views
    py_only = build_report(Analysis(r.out, Attribution(view="python")), depth=1)
    assert {x["label"].split(" ")[0] for x in py_only["sites"]} == {"kv_cache", "load_weights"}
    assert all(x["via"][-1]["function"] == "device_alloc" for x in py_only["sites"])
    assert all(f["python"] for s in py_only["sites"] for f in s["context"])
    native = build_report(Analysis(r.out, Attribution(view="native")), depth=1)
    assert not any(f["python"] for s in native["sites"] for f in s["context"])
    # text
    text = ct.cli("report", r.out, "--depth", "2").stdout
    assert "via device_alloc" in text
    assert (
        "kv_cache (prog.py:%d)" % L["kv"] in text
        and "5 device allocations with Python frames" in text
    )


C_THREAD = r"""
#include <pthread.h>
#include <stdint.h>
typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *, unsigned long);
int cuCtxSetCurrent(void *);
static void *ctx;
static void *body(void *arg)
{
    CUdeviceptr p;
    cuCtxSetCurrent(ctx);
    for (long i = 0; i < (long)(intptr_t)arg; i++)
        cuMemAlloc_v2(&p, 1 << 20);
    return 0;
}
int alloc_from_c_thread(void *c, long n)
{
    pthread_t t;
    ctx = c;
    if (pthread_create(&t, 0, body, (void *)(intptr_t)n))
        return -1;
    return pthread_join(t, 0);
}
"""

THREADS = (
    PRELUDE
    + r"""
import threading
lib = ctypes.CDLL(sys.argv[1])
lib.alloc_from_c_thread(_ctx, 3)      # a thread started from C, never ran Python

def worker():
    device_alloc(2 << 20)  # LINE:worker
t = threading.Thread(target=worker)
t.start(); t.join()
"""
)


@pytest.mark.parametrize("exe", INTERPRETERS)
def test_threads_from_c_and_from_python(ct, sim, exe, tmp_path):
    so = tmp_path / "libcthread.so"
    (tmp_path / "cthread.c").write_text(C_THREAD)
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-O1",
            "-pthread",
            "-o",
            str(so),
            str(tmp_path / "cthread.c"),
            f"-L{sim.lib}",
            "-lcuda",
        ],
        check=True,
    )
    prog = tmp_path / "threads.py"
    prog.write_text(THREADS)
    r = ct.run([exe, prog, so])
    assert r.returncode == 0, r.stderr
    a = Analysis(r.out)
    rep = build_report(a, depth=2)
    py = rep["python"]
    assert py["allocs_with_frames"] == 1
    assert py["allocs_without_frames"] == {pyframes.WHY[1]: 3}
    site = next(s for s in rep["sites"] if s["frames"] and s["frames"][0]["python"])
    assert (
        site["frames"][1]["function"] == "worker"
        and site["frames"][1]["line"] == lines_of(THREADS)["worker"]
    )
    assert "3 without: thread has no Python thread state" in ct.cli("report", r.out).stdout


FORK = (
    PRELUDE
    + r"""
def in_child():
    device_alloc(7 << 20)  # LINE:child

pid = os.fork()
if pid == 0:
    in_child()
    os._exit(0)
os.waitpid(pid, 0)
device_alloc(1 << 20)
"""
)


@pytest.mark.parametrize("exe", INTERPRETERS)
def test_forked_child_has_its_own_python_frames(ct, exe, tmp_path):
    r, prog = run_py(ct, exe, FORK, tmp_path)
    td = read_dir(r.out)
    assert len(td.traces) == 2
    pids = {t.pid for t in td.traces}
    (child,) = [t for t in td.traces if t.ppid in pids]  # whatever order the files are read in
    leaves = [e["stack"] for e in iter_events(child) if e["op"] == C()["CT_OP_ALLOC"]]
    assert len(leaves) == 1
    fr = child.py_stack(leaves[0])
    assert [f.code.qualname for f in fr][:2] == ["device_alloc", "in_child"]
    assert fr[1].line == lines_of(FORK)["child"]


SHUTDOWN = (
    PRELUDE
    + r"""
import atexit, threading, time

def at_exit():
    device_alloc(1 << 20)  # LINE:atexit
atexit.register(at_exit)

class Holder:
    def __del__(self, cuda=cuda, ctypes=ctypes):   # module globals may be gone by then
        p = ctypes.c_uint64()
        cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 20))  # LINE:del
HOLD = Holder()                   # collected while the interpreter finalizes

# a daemon thread still allocating while the interpreter exits (its globals are not __main__'s,
# which would keep HOLD alive)
SPIN = '''
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
def spin():
    while True:
        p = ctypes.c_uint64()
        cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4096))
        cuda.cuMemFree_v2(p)
'''
ns = {}
exec(SPIN, ns)
threading.Thread(target=ns["spin"], daemon=True).start()
time.sleep(0.05)
"""
)


@pytest.mark.parametrize("exe", INTERPRETERS)
def test_allocations_during_shutdown(ct, exe, tmp_path):
    prog = tmp_path / "shutdown.py"
    prog.write_text(SHUTDOWN)
    for _ in range(3):  # the daemon thread's timing differs run to run
        r = ct.run([exe, prog], timeout=60)
        assert r.returncode == 0, r.stderr
        td = read_dir(r.out)
        t = td.traces[0]
        assert t.complete
        L = lines_of(SHUTDOWN)
        big = [e for e in iter_events(t) if e["op"] == C()["CT_OP_ALLOC"] and e["size"] == 1 << 20]
        assert len(big) == 2
        lines = set()
        for e in big:
            fr = t.py_stack(e["stack"])
            if fr:
                lines.update((f.code.qualname, f.line) for f in fr[:2])
            else:  # counted with a reason, never lost
                assert t.py_link(e["stack"])[0] == pyframes.LINK_WHY
        assert ("at_exit", L["atexit"]) in lines
        # the finalizing thread itself may be read: __del__ at shutdown keeps its frames
        assert ("Holder.__del__", L["del"]) in lines
        rep = build_report(Analysis(r.out, td=td))
        py = rep["python"]
        n = sum(py["allocs_without_frames"].values()) + py["allocs_with_frames"]
        assert n == rep["counts"]["allocs"]


SUBINTERP = (
    PRELUDE
    + r"""
CODE = '''
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
p = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(6 << 20)) == 0
'''
try:
    import _interpreters as subs                 # 3.13
    i = subs.create("legacy")                    # ctypes does not load in an isolated one
    subs.exec(i, CODE)
except ImportError:
    try:
        import _xxsubinterpreters as subs        # 3.12
    except ImportError:
        print("NO-SUBINTERPRETERS")
        sys.exit(0)
    i = subs.create(isolated=False)
    subs.run_string(i, CODE)
subs.destroy(i)
device_alloc(1 << 20)
"""
)


@pytest.mark.parametrize("exe", INTERPRETERS)
def test_subinterpreter(ct, exe, tmp_path):
    r, prog = run_py(ct, exe, SUBINTERP, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "NO-SUBINTERPRETERS" not in r.stdout, f"{exe} lacks _interpreters/_xxsubinterpreters"
    td = read_dir(r.out)
    t = td.traces[0]
    allocs = [e for e in iter_events(t) if e["op"] == C()["CT_OP_ALLOC"]]
    assert sorted(e["size"] for e in allocs) == [1 << 20, 6 << 20]
    for e in allocs:
        assert t.py_link(e["stack"]) is not None  # frames, or counted with a reason
    main = next(e for e in allocs if e["size"] == 1 << 20)
    assert [f.code.qualname for f in t.py_stack(main["stack"])][:1] == ["device_alloc"]


def test_no_python_no_link_nodes(ct, sim):
    r = ct.run([sim.progs["route_link"]])
    assert r.returncode == 0, r.stderr
    t = read_dir(r.out).traces[0]
    assert "python.status" not in t.info and t.py is None
    assert not any(pyframes.is_link(ip) for ip in t.ips)
    assert build_report(Analysis(r.out))["python"] is None


def test_python_disabled_by_switch(ct, tmp_path):
    env = ct.env()
    env["CUDATRACE_PYTHON"] = "0"
    prog = tmp_path / "prog.py"
    prog.write_text(MAIN)
    r = ct.run([sys.executable, prog], env=env)
    assert r.returncode == 0, r.stderr
    t = read_dir(r.out).traces[0]
    assert t.py is None and not any(pyframes.is_link(ip) for ip in t.ips)


def test_diff_matches_python_sites_across_runs(ct, tmp_path):
    runs = []
    for layers in (4, 2):
        src = MAIN.replace("kv_cache(4)  # LINE:call_kv", "kv_cache(%d)  # LINE:call_kv" % layers)
        d = tmp_path / ("r%d" % layers)
        d.mkdir()
        r, _ = run_py(ct, sys.executable, src, d)
        runs.append(r.out)
    r = ct.cli("diff", runs[0], runs[1], "--json")
    assert r.returncode == 0, r.stderr
    import json

    j = json.loads(r.stdout)
    rows = {tuple(f["function"] for f in s["frames"]): s for s in j["sites"]}
    kv = rows[("kv_cache",)]  # the Python helper folded as an allocator layer
    assert kv["status"] == "shrunk"
    assert (kv["peak"]["a_bytes"], kv["peak"]["b_bytes"]) == (4 * (3 << 20), 2 * (3 << 20))
    assert rows[("load_weights",)]["status"] == "same"


NESTED = (
    PRELUDE
    + r"""
def kv_cache(layers):      # map() calls the lambda from C: a second eval-loop call
    return list(map(lambda _: device_alloc(1 << 20), range(layers)))  # LINE:lambda
kv_cache(2)  # LINE:call
"""
)


@pytest.mark.parametrize("exe", INTERPRETERS)
def test_nested_eval_loops_merge_in_place(ct, exe, tmp_path):
    r, prog = run_py(ct, exe, NESTED, tmp_path)
    L = lines_of(NESTED)
    a = Analysis(r.out)
    t = a.traces[0]
    leaf = next(e["stack"] for e in iter_events(t) if e["op"] == C()["CT_OP_ALLOC"])
    assert [(f.code.qualname, f.entry) for f in t.py_stack(leaf)] == [
        ("device_alloc", False),
        ("kv_cache.<locals>.<lambda>", True),
        ("kv_cache", False),
        ("<module>", True),
    ]
    full = a.stacks.all_frames(0, leaf)
    names = [f.function for f in full]
    # each run of Python frames stands where its eval-loop call stood: map()'s and list()'s
    # native frames between them (named where the interpreter has symbols)
    i_lambda, i_kv = names.index("kv_cache.<locals>.<lambda>"), names.index("kv_cache")
    between = full[i_lambda + 1 : i_kv]
    assert len(between) >= 2 and not any(f.python for f in between)
    if any(n and n.startswith("list_") for n in names):
        assert any(n and n.startswith("map_next") for n in names[i_lambda:i_kv])
    assert names.index("<module>") == i_kv + 1
    assert "_PyEval_EvalFrameDefault" not in names
    f = [x for x in a.stacks.all_frames(0, leaf) if x.python]
    assert [x.line for x in f] == [L["helper"], L["lambda"], L["lambda"], L["call"]]


@pytest.mark.parametrize("exe", OLDER_INTERPRETERS)
def test_older_cpython_is_refused_with_a_note(ct, exe, tmp_path):
    r, prog = run_py(ct, str(exe), MAIN, tmp_path)
    t = read_dir(r.out).traces[0]
    assert "older than 3.11" in t.info["python.status"]
    assert t.py is None  # nothing read from it
    rep = build_report(Analysis(r.out))
    assert rep["python"]["allocs_with_frames"] == 0
    assert rep["python"]["allocs_without_frames"] == {pyframes.WHY[3]: 5}
    # the native stacks are all there
    assert rep["sites"] and not any(f["python"] for s in rep["sites"] for f in s["context"])
    text = ct.cli("report", r.out).stdout
    assert "older than 3.11" in text and "5 without: Python version or build not supported" in text


# ---- synthetic traces (tests/support/tracegen.py): the offline side alone -------------------------
def test_merge_views_and_reasons_from_a_written_trace(tmp_path):
    from support import tracegen as tg

    d = tmp_path / "synthetic"
    d.mkdir()
    w = tg.TraceWriter(
        d / "1.0.ctrace",
        pid=1,
        exe="/usr/bin/python3.11",
        info={
            "python.version": "3.11.7",
            "python.status": "ok",
            "python.eval_range": "0x401000-0x402000",
        },
    )
    w.module("/usr/bin/python3.11", 0x400000, 0x800000)
    w.module("/opt/app/libmine.so", 0x900000, 0x980000)
    helper = w.pycode("/app/alloc.py", "device_alloc", 10, [10, 11, 12, 12])
    kv = w.pycode("/app/model.py", "kv_cache", 20, [20, 21, 22])
    mod = w.pycode("/app/serve.py", "<module>", 1, [1, 2, 3, 4])
    # innermost first: libmine (native caller of the driver), ctypes glue in the interpreter,
    # the inner eval loop (device_alloc, <lambda>-less here: kv_cache), glue, the outer eval loop
    native = [0x900100, 0x600010, 0x401010, 0x600020, 0x401020, 0x600030]
    leaf = w.pystack([(helper, 2, False), (kv, 1, True), (mod, 3, True)])
    with_py = w.pylink(native, py_leaf=leaf)
    from_c = w.pylink([0x900200], why=1)
    w.alloc(tg.BASE_TS + 1000, 4 << 20, 0x10000, stack=with_py)
    w.alloc(tg.BASE_TS + 2000, 4 << 20, 0x20000, stack=with_py)
    w.alloc(tg.BASE_TS + 3000, 1 << 20, 0x30000, stack=from_c)
    w.close()
    a = Analysis(d, symbolize=False)
    t = a.traces[0]
    assert t.stack(with_py) == native  # the link is not a native frame
    assert [(f.code.qualname, f.line, f.entry) for f in t.py_stack(with_py)] == [
        ("device_alloc", 12, False),
        ("kv_cache", 21, True),
        ("<module>", 4, True),
    ]
    full = a.stacks.all_frames(0, with_py)
    assert [f.function or hex(f.address) for f in full] == [
        "0x900100",
        "0x600010",
        "device_alloc",
        "kv_cache",
        "0x600020",
        "<module>",
        "0x600030",
    ]
    kept = a.stacks.frames(0, with_py)  # the interpreter's own frames folded
    assert [f.function or hex(f.address) for f in kept] == [
        "0x900100",
        "device_alloc",
        "kv_cache",
        "<module>",
    ]
    rep = build_report(a, depth=1)
    assert rep["python"]["allocs_with_frames"] == 2
    assert rep["python"]["allocs_without_frames"] == {pyframes.WHY[1]: 1}
    py = Analysis(d, Attribution(view="python"), symbolize=False)
    assert [f.function for f in py.stacks.frames(0, with_py)] == [
        "device_alloc",
        "kv_cache",
        "<module>",
    ]
    site = build_report(py, depth=2)["sites"][0]
    assert site["bytes"] == 8 << 20 and [(f["file"], f["line"]) for f in site["frames"]] == [
        ("/app/alloc.py", 12),
        ("/app/model.py", 21),
    ]
    nat = Analysis(d, Attribution(view="native"), symbolize=False)
    assert [f.address for f in nat.stacks.all_frames(0, with_py)] == native


def test_reader_constants_are_layout_h():
    K = C()
    assert (
        pyframes.LINK_TAG,
        pyframes.LINK_MASK,
        pyframes.LINK_FRAMES,
        pyframes.LINK_WHY,
        pyframes.PYF_ENTRY,
        pyframes.PYF_NO_OFFSET,
    ) == (
        K["CT_PYLINK_TAG"],
        K["CT_PYLINK_MASK"],
        K["CT_PYLINK_FRAMES"],
        K["CT_PYLINK_WHY"],
        K["CT_PYF_ENTRY"],
        K["CT_PYF_NO_OFFSET"],
    )
    whys = {v: k for k, v in K.items() if k.startswith("CT_PYWHY_")}
    assert set(pyframes.WHY) == set(whys)


MANY_THREADS = (
    PRELUDE
    + r"""
import threading
def short_lived(i):
    device_alloc(4096 + i)  # LINE:short
for batch in range(10):
    ts = [threading.Thread(target=short_lived, args=(batch * 20 + k,)) for k in range(20)]
    for t in ts: t.start()
    for t in ts: t.join()
"""
)


def test_many_short_threads(ct, tmp_path):
    r, prog = run_py(ct, sys.executable, MANY_THREADS, tmp_path)
    t = read_dir(r.out).traces[0]
    allocs = [e for e in iter_events(t) if e["op"] == C()["CT_OP_ALLOC"]]
    assert len(allocs) == 200 and len({e["tid"] for e in allocs}) > 1
    L = lines_of(MANY_THREADS)
    for e in allocs:
        fr = t.py_stack(e["stack"])
        assert [(f.code.qualname, f.line) for f in fr[:2]] == [
            ("device_alloc", L["helper"]),
            ("short_lived", L["short"]),
        ], (t.py_link(e["stack"]), e["tid"], allocs.index(e))


# ---- a framework's own Python API above the allocation ------------------------------------
USES_FRAMEWORK = r"""
import fakefw

def kv_cache(layers):
    out = []
    for _ in range(layers):
        out.append(fakefw.empty(3 << 20))  # LINE:kv
    return out

kv_cache(2)
"""


def test_framework_api_frames_fold_under_the_program_line(ct, tmp_path):
    """An installed framework's Python API called from one place is no allocator layer by the
    call graph, yet the program's line that called it is what asked for the memory."""
    sp = site_packages(tmp_path)
    env = ct.env()
    env["PYTHONPATH"] = str(sp) + os.pathsep + env["PYTHONPATH"]
    prog = tmp_path / "prog.py"
    prog.write_text(USES_FRAMEWORK)
    r = ct.run([sys.executable, prog], env=env)
    assert r.returncode == 0, r.stderr
    (site,) = build_report(Analysis(r.out))["sites"]
    (head,) = site["frames"]
    assert (head["function"], head["file"], head["line"]) == (
        "kv_cache",
        str(prog),
        lines_of(USES_FRAMEWORK)["kv"],
    )
    assert (site["bytes"], site["count"]) == (2 * (3 << 20), 2)
    via = [f["function"] for f in site["via"] if f["python"]]
    assert via[:2] == ["device_alloc", "malloc"] and via[-1] == "empty"
    assert "JSONDecoder.decode" in via
    # the native-only view is untouched by the rule; --python-only names the same line
    py = build_report(Analysis(r.out, Attribution(view="python")))["sites"][0]["frames"][0]
    assert (py["function"], py["line"]) == ("kv_cache", head["line"])

    # an installed application (python -m) calling the framework: the application's frame
    r = ct.run([sys.executable, "-m", "fakeapp"], env=env)
    assert r.returncode == 0, r.stderr
    (site,) = build_report(Analysis(r.out))["sites"]
    head = site["frames"][0]
    assert (head["function"], head["line"]) == ("start_engine", lines_of(FAKE_APP)["app"])
    assert head["file"].endswith("site-packages/fakeapp/engine.py")

    # nothing but the framework and the stdlib (runpy): the framework's innermost frame heads
    r = ct.run([sys.executable, "-m", "fakefw.selftest"], env=env)
    assert r.returncode == 0, r.stderr
    (site,) = build_report(Analysis(r.out))["sites"]
    assert site["frames"][0]["function"] == "device_alloc"


def test_cost_benchmark_runs_and_records_the_frames(tmp_path):
    """tools/bench_pyframes.py (the cost figure of docs/python-frames.md) still runs against
    the product's modules, and the events it times carry the Python stack it claims to."""
    import json

    r = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench_pyframes.py")]
        + ["--rounds", "1", "--pairs", "50", "--depth", "7"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ns per event" in r.stdout and "nan" not in r.stdout
    depths = r.stdout.split("Python frames recorded per event: ")[1].split("\n")[0]
    # DEPTH nested calls under the benchmark's own loop and module frames
    assert min(json.loads(depths)) >= 7, r.stdout
