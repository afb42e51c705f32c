"""The native code under AddressSanitizer and UndefinedBehaviorSanitizer: the preload library
(lock-free ledger, an unwinder reading raw stack memory, the Python-frames reader), the ledger's
C harness and the trace reader fuzzed with hostile files, each built with
`make -C native sanitize` (the same sources, -fsanitize=address,undefined, every report fatal).
And under ThreadSanitizer (`make -C native tsan`): the threaded paths, the writer's per-thread
blocks and the ledger's lock-free accounting, in the shim and in the ledger's harness.

A sanitizer's report ends the process with a non-zero status and "ERROR: AddressSanitizer",
"runtime error:" or "WARNING: ThreadSanitizer" on stderr; each test fails on any.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudatrace import settings
from support import ctxhold, ledger_harness
from support.paths import CTXHOLD_C, REPO
from support.shared_build import shared_build

SAN_MARKS = (
    "ERROR: AddressSanitizer",
    "runtime error:",
    "ERROR: LeakSanitizer",
    "WARNING: ThreadSanitizer",
    "ThreadSanitizer: ",
)
# halt on the first report; leaks are the target program's business (and Python's)
SAN_OPTIONS = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=99:verify_asan_link_order=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=98",
}
# the known findings not fixed yet, each named there (support/tsan.supp)
TSAN_SUPP = REPO / "tests" / "support" / "tsan.supp"
TSAN_OPTIONS = {
    "TSAN_OPTIONS": f"halt_on_error=1:exitcode=97:report_signal_unsafe=0:suppressions={TSAN_SUPP}"
}


def _runtime(name: str) -> str:
    cc = os.environ.get("CC", "cc")
    path = subprocess.run(
        [cc, f"-print-file-name={name}"], capture_output=True, text=True
    ).stdout.strip()
    assert os.path.isabs(path) and os.path.exists(path), (
        f"{cc} has no {name}: the sanitizer tests need gcc's libasan and libubsan "
        "(Debian: gcc brings them)"
    )
    return path


def _make(out: Path, target: str) -> str:
    """`make -C native TARGET OUT=out` (both libraries under a sanitizer); out, as text."""
    assert shutil.which("make"), "the sanitizer tests need make"
    r = subprocess.run(
        ["make", "-s", "-C", str(REPO / "native"), target, f"OUT={out}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return str(out)


@pytest.fixture(scope="module")
def san(tmp_path_factory):
    """{dir: the sanitized libraries, preload: the runtimes, env: what a process needs}"""
    out = Path(shared_build(tmp_path_factory, "asan", lambda d: _make(d, "sanitize")))
    preload = f"{_runtime('libasan.so')}:{_runtime('libubsan.so')}"
    env = dict(SAN_OPTIONS, CUDATRACE_NATIVE_DIR=str(out))
    return {"dir": out, "preload": preload, "env": env}


def _clean(r: subprocess.CompletedProcess) -> None:
    text = (r.stdout or "") + (r.stderr or "")
    marks = [m for m in SAN_MARKS if m in text]
    assert not marks, f"sanitizer report ({marks}):\n{text[-8000:]}"


def _traced(ct, sim, san, argv, *opts, sim_opts=None, extra=None):
    """`cudatrace run` of argv with the sanitized shim (the sanitizers' runtimes first)."""
    env = ct.env(**(sim_opts or {}))
    env.update(san["env"])
    env.update(extra or {})
    env["LD_PRELOAD"] = san["preload"]
    r = ct.run(argv, *opts, env=env, timeout=300)
    _clean(r)
    return r


@pytest.mark.parametrize(
    "case",
    [
        ("route_link", []),
        ("route_gpa", []),
        ("threads", ["8", "200", "1m"]),
        ("forkexec", ["2"]),
        ("churn", ["300", "4", "1m"]),
    ],
    ids=lambda c: c[0],
)
def test_shim_under_sanitizers(ct, sim, san, case):
    name, args = case
    prog = sim.progs[name]
    assert prog is not None, f"{name} was not built"
    r = _traced(ct, sim, san, [prog, *args])
    assert r.returncode == 0, r.stderr[-4000:]
    assert list(r.out.glob("*.ctrace")), "no trace written"


def test_budget_under_sanitizers(ct, sim, san):
    """The ledger's lock-free paths: threads racing over one budget, denials included."""
    r = _traced(
        ct,
        sim,
        san,
        [sim.progs["budget_hammer"], "8", "300", "1m"],
        "--budget",
        "6MiB",
    )
    assert r.returncode == 0, r.stderr[-4000:]


def test_fencing_under_sanitizers(ct, sim, san, tmp_path):
    """The environment's group (joined and its budget decided by ct_ledger_adopt, threads racing
    over it) and a fence that cannot be set up (refused, its line said and recorded)."""
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    group = {"CUDATRACE_LEDGER_DIR": str(d), "CUDATRACE_GROUP": "g", "CUDATRACE_BUDGET": "6MiB"}
    r = _traced(ct, sim, san, [sim.progs["budget_hammer"], "8", "300", "1m"],
                sim_opts={}, extra=group)  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    r = _traced(ct, sim, san, [sim.progs["hold"], "--exit-after-ms", "1", "1", "1m"],
                extra=dict(group, CUDATRACE_BUDGET="lots"))  # fmt: skip
    assert r.returncode == 1 and "fencing cannot be set up" in r.stderr, r.stderr[-4000:]


def test_sealed_records_under_sanitizers(ct, sim, san, tmp_path):
    """The sealed fence record read at load (native/shim/fence.c): a good one with the
    environment beside it (a larger budget ignored, a lower one taken), and the malformed ones
    of tests/support/fence_cases.py (each refused), in a private /etc (tests/support/sealroot.py)."""
    from support import sealroot
    from support.fence_cases import GOOD, MALFORMED

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env()
    env.update(san["env"])
    env["LD_PRELOAD"] = f"{san['preload']}:{Path(san['dir']) / 'libcudatrace.so'}"
    texts = {"good": GOOD, **{k: v[0] for k, v in MALFORMED.items()}}
    for n, (name, text) in enumerate(sorted(texts.items())):
        rec = tmp_path / f"fence-{n}"
        rec.write_text(text.replace("LEDGERS", str(d)))
        rec.chmod(0o644)
        for extra in (
            {"CUDATRACE_BUDGET": "8GiB", "CUDATRACE_GROUP": "x"},
            {"CUDATRACE_BUDGET": "1MiB"},
        ):
            argv = sealroot.prefix(tmp_path / f"ns-{n}", fence=rec)
            r = subprocess.run([*argv, sim.progs["hold"], "--exit-after-ms", "1", "1", "2m"],
                               env=dict(env, **extra), capture_output=True, text=True,
                               timeout=300)  # fmt: skip
            _clean(r)
            assert ("fencing cannot be set up" in r.stderr) == (name != "good"), (name, r.stderr)


def test_aggregate_and_python_frames_under_sanitizers(ct, sim, san, tmp_path):
    """--aggregate's tables, and the Python-frames reader walking a live interpreter."""
    script = tmp_path / "alloc.py"
    script.write_text(
        "import ctypes\n"
        "cuda = ctypes.CDLL('libcuda.so.1')\n"
        "cuda.cuInit(0)\n"
        "ctx = ctypes.c_void_p()\n"
        "cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0)\n"
        "def kv(n):\n"
        "    p = ctypes.c_uint64()\n"
        "    for _ in range(n):\n"
        "        assert cuda.cuMemAlloc_v2(ctypes.byref(p), 1 << 20) == 0\n"
        "        assert cuda.cuMemFree_v2(p) == 0\n"
        "kv(200)\n"
    )
    for opts in ([], ["--aggregate"]):
        r = _traced(ct, sim, san, [sys.executable, str(script)], *opts)
        assert r.returncode == 0, r.stderr[-4000:]


def test_python_denial_under_sanitizers(ct, sim, san):
    """A denial's line read from the interpreter's frames (names, files, line tables) and the
    recorded Python stacks' call graph; with Python frames off, the native frames said raw."""
    train = REPO / "examples" / "tiny-train" / "train.py"
    for extra, want in (
        ({}, "; at forward (train.py:55) via device_alloc, called from main (train.py:"),
        ({"CUDATRACE_PYTHON": "0"}, "; at Python code whose frames the shim could not read"),
    ):
        r = _traced(ct, sim, san, [sys.executable, str(train)], "--budget", "300MiB", extra=extra)
        assert r.returncode == 1 and want in r.stderr, r.stderr[-4000:]


def test_denial_line_reads_dwarf_under_sanitizers(sim, san, tmp_path):
    """No launcher, no hints: the shim reads the program's DWARF at each denial (the calls -O2
    inlined, their names, the line table: native/shim/dwarf.c, dwline.c) and names the three
    callers of eng.cpp with their lines."""
    from support.attrib_shapes import build

    exe = build("eng", tmp_path / "eng", sim.lib, True)
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = sim.env(state=sim.new_state(), total_bytes=16 << 30)
    env.update(san["env"], CUDATRACE_LEDGER_DIR=str(d), CUDATRACE_GROUP="g")
    env.update(CUDATRACE_BUDGET="16MiB", CUDATRACE_QUIET="1")
    env["LD_PRELOAD"] = san["preload"] + ":" + str(Path(san["dir"]) / "libcudatrace.so")
    r = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=300)
    _clean(r)
    assert r.returncode == 0, r.stderr[-4000:]
    for name in ("eng::Attention::reserve", "eng::Model::load", "eng::Server::start::{lambda}"):
        assert "; at %s (eng.cpp:" % name in r.stderr, r.stderr[-4000:]


def test_ledger_harness_under_sanitizers(san, tmp_path):
    exe = ledger_harness.build(tmp_path / "ledger_test", "ledger_test", ledger_harness.ASAN)
    env = dict(os.environ, **SAN_OPTIONS)
    for case in ("hammer", "kill", "reuse", "saturate", "security", "fork", "full"):
        r = ledger_harness.run(exe, tmp_path, case, env=env)
        _clean(r)
        assert r.returncode == 0, f"{case}: {r.stdout}{r.stderr}"


def _ctxhold_harness(tmp_path: Path, flags: list[str], env: dict[str, str]) -> None:
    """The context hold's harness (tests/ctxhold/ctxhold_test.c, with the shim's ctxhold.c): every
    case, each in a process of its own, then random schedules; no report, every case ok."""
    exe = ctxhold.build(tmp_path / "ctxhold_test", flags)
    for args in (["all"], ["shuffle", "200"]):
        r = ctxhold.run(exe, tmp_path, *args, env=env)
        _clean(r)
        assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok shuffle", r.stdout


def test_ctxhold_harness_under_sanitizers(tmp_path):
    """The context hold stepped through every case under ASan + UBSan."""
    _ctxhold_harness(tmp_path, ctxhold.ASAN, dict(os.environ, **SAN_OPTIONS))


def test_parts_harness_under_sanitizers(san):
    """A group of several users (tests/ledger/parts_test.c): their parts hammered, damaged."""
    with ledger_harness.users_dir() as d:
        exe = ledger_harness.build(d / "parts_test", "parts_test", ledger_harness.ASAN)
        env = dict(os.environ, **SAN_OPTIONS)
        for case in ("hammer", "late", "forked", "damage", "agent"):
            r = ledger_harness.run(exe, d, case, mode=0o755, timeout=300, env=env)
            _clean(r)
            assert r.returncode == 0, f"{case}: {r.stdout}{r.stderr}"


def test_reader_fuzz_under_sanitizers(ct, sim, san, tmp_path):
    """support/fuzz_reader.py against the sanitized scanner and replay (no RLIMIT_AS: the
    sanitizer's shadow memory needs the address space; the plain fuzz test bounds memory)."""
    from support.tracegen import write_scenario

    r = ct.run([sim.progs["route_link"]])
    assert r.returncode == 0, r.stderr
    write_scenario(tmp_path / "scen")
    files = [str(p) for p in sorted(r.out.glob("*.ctrace"))]
    files.append(str(tmp_path / "scen" / "1000.0.ctrace"))
    env = dict(os.environ, **san["env"])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests")])
    env["LD_PRELOAD"] = san["preload"]
    res = subprocess.run(
        [sys.executable, "-m", "support.fuzz_reader", "150", "0", *files],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    _clean(res)
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    assert "ok: 150 examples" in res.stdout
    # the sanitized tools library was the one read through
    assert Path(san["dir"], "libcudatrace_tools.so").is_file()


# ---- ThreadSanitizer: the threaded paths ------------------------------------------------------


@pytest.fixture(scope="module")
def tsan(tmp_path_factory):
    """{dir: the libraries built under TSan, preload: its runtime, env: what a process needs}"""
    out = Path(shared_build(tmp_path_factory, "tsan", lambda d: _make(d, "tsan")))
    env = dict(TSAN_OPTIONS, CUDATRACE_NATIVE_DIR=str(out))
    return {"dir": out, "preload": _runtime("libtsan.so"), "env": env}


def _tsan_run(ct, sim, tsan, tmp_path, argv, **settings_env):
    """argv under the TSan shim, preloaded by hand after the TSan runtime (the launcher would
    put the shim first and run itself under it); its trace in tmp_path/trace, read back."""
    out = tmp_path / "trace"
    out.mkdir()
    env = ct.env()
    env.update(tsan["env"])
    env.update(settings.environment(DIR=out, **settings_env))
    env["LD_PRELOAD"] = f"{tsan['preload']}:{tsan['dir'] / 'libcudatrace.so'}"
    r = subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=env, timeout=300)
    _clean(r)
    assert r.returncode == 0, r.stderr[-4000:]
    assert list(out.glob("*.ctrace")), "no trace written"
    rep = ct.cli("report", "--json", out)
    assert rep.returncode == 0, rep.stderr
    return json.loads(rep.stdout)


def test_threads_writing_one_trace_under_tsan(ct, sim, tsan, tmp_path):
    """8 threads, each filling its own event blocks of one file (writer.c, events.c)."""
    rep = _tsan_run(ct, sim, tsan, tmp_path, [sim.progs["threads"], "8", "200", "1m"])
    assert rep["counts"]["events"] >= 8 * 200 * 2


def test_threads_racing_over_a_budget_under_tsan(ct, sim, tsan, tmp_path):
    """The ledger's lock-free reservations from 8 threads, denials included (ledger.c,
    budget.c), with the trace written beside them."""
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir(mode=0o700)
    rep = _tsan_run(
        ct,
        sim,
        tsan,
        tmp_path,
        [sim.progs["budget_hammer"], "8", "300", "1m"],
        GROUP="tsan",
        BUDGET=6 << 20,
        LEDGER_DIR=ledgers,
    )
    assert rep["counts"]["events"] > 0


def _tsan_exe(tmp_path, name, *sources):
    cc = os.environ.get("CC", "cc")
    exe = tmp_path / name
    cmd = [cc, "-std=gnu11", "-O1", "-g", "-fsanitize=thread", "-D_GNU_SOURCE", "-pthread"]
    cmd += ["-I", str(REPO / "native/include"), *map(str, sources), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


def test_ledger_harness_under_tsan(tmp_path):
    """The ledger's C harness: processes x threads hammering one budget, kills, forks."""
    exe = ledger_harness.build(tmp_path / "ledger_test", "ledger_test", ledger_harness.TSAN)
    env = dict(os.environ, **TSAN_OPTIONS)
    for case in ("hammer", "kill", "saturate", "fork"):
        r = ledger_harness.run(exe, tmp_path, case, timeout=300, env=env)
        _clean(r)
        assert r.returncode == 0, f"{case}: {r.stdout}{r.stderr}"


def test_parts_harness_under_tsan():
    """Several users' parts of one group hammered by threads (ledger_parts.c: the directory
    looked at by one thread at a time, the parts read by all)."""
    with ledger_harness.users_dir() as d:
        exe = ledger_harness.build(d / "parts_test", "parts_test", ledger_harness.TSAN)
        env = dict(os.environ, **TSAN_OPTIONS)
        r = ledger_harness.run(
            exe, d, "hammer", "3", "2", "4", "500", mode=0o755, timeout=300, env=env
        )
        _clean(r)
        assert r.returncode == 0, r.stdout + r.stderr


def test_ctxhold_harness_under_tsan(tmp_path):
    """The context hold's threads (the measuring one, those it holds, frees) under TSan: each
    case's interleaving and the random ones, and the case "concurrent", whose threads run freely
    (in lock-step, the harness's own lock orders every access for TSan)."""
    _ctxhold_harness(tmp_path, ctxhold.TSAN, dict(os.environ, **TSAN_OPTIONS))


def test_ctxhold_race_planted_is_caught_under_tsan(tmp_path):
    """A plain store planted in ctxhold.c (a device's state, which held threads read): the case
    "concurrent" under TSan reports it (the test above can fail)."""
    text = CTXHOLD_C.read_text()
    store = "    __atomic_store_n(&d->state, state, __ATOMIC_RELEASE);\n"
    assert text.count(store) == 1, "the planted race no longer applies to ctxhold.c: plant another"
    planted = tmp_path / "ctxhold.c"
    planted.write_text(text.replace(store, "    d->state = state;\n"))
    exe = ctxhold.build(tmp_path / "ctxhold_test", ctxhold.TSAN, planted)
    r = ctxhold.run(exe, tmp_path, "concurrent", env=dict(os.environ, **TSAN_OPTIONS))
    assert r.returncode == 97 and "WARNING: ThreadSanitizer: data race" in r.stderr, r.stderr


def test_tsan_reports_are_caught(tmp_path):
    """A planted race: the TSan build and the check above see it (the tests can fail)."""
    src = tmp_path / "race.c"
    src.write_text(
        "#include <pthread.h>\n"
        "static long n;\n"
        "static void *bump(void *a) { for (int i = 0; i < 100000; i++) n++; return a; }\n"
        "int main(void) {\n"
        "    pthread_t t[2];\n"
        "    for (int i = 0; i < 2; i++) pthread_create(&t[i], 0, bump, 0);\n"
        "    for (int i = 0; i < 2; i++) pthread_join(t[i], 0);\n"
        "    return n == 0;\n"
        "}\n"
    )
    exe = _tsan_exe(tmp_path, "race", src)
    r = subprocess.run(
        [str(exe)], capture_output=True, text=True, timeout=60, env=dict(os.environ, **TSAN_OPTIONS)
    )
    assert r.returncode == 97
    with pytest.raises(AssertionError, match="sanitizer report"):
        _clean(r)
