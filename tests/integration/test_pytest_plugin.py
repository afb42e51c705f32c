"""The pytest plugin (cudatrace/pytest_plugin.py, docs/pytest.md) on the simulated driver, through
pytester: limits and leaks fail with the test's own lines and exact bytes, warm-ups are
forgiven, pytest is executed again under the shim when it is not loaded (and not when it is),
pytest-xdist workers inherit it, bad markers are collection errors; markers are read when the
test runs (unittest methods, markers added later); the figures are the test's own allocations;
processes a test starts are said; the output files follow cudatrace/outputs.py; a run without a
CUDA driver says how to get one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

from support.paths import REPO

pytest_plugins = ["pytester"]

MiB = 1 << 20

CONFTEST = r"""
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
_dev = ctypes.c_int()
cuda.cuDeviceGet(ctypes.byref(_dev), 0)
_ctx = ctypes.c_void_p()
cuda.cuCtxCreate_v2(ctypes.byref(_ctx), 0, _dev)

def device_alloc(nbytes):
    p = ctypes.c_uint64()
    r = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes))
    assert r == 0, r
    return p.value

def device_free(p):
    assert cuda.cuMemFree_v2(ctypes.c_uint64(p)) == 0
"""

SUITE = r"""
import os
import pytest
from conftest import device_alloc, device_free

KEPT = []
CACHE = []

def test_plain():
    device_free(device_alloc(1 << 20))

@pytest.mark.limit_gpu_memory("2 GiB")
def test_under_limit():
    p = device_alloc(1 << 20)
    device_free(p)

@pytest.mark.limit_gpu_memory("2MiB")
def test_over_limit():
    a = device_alloc(1 << 20)
    b = device_alloc(3 << 20)  # LINE:over
    device_free(b)
    device_free(a)

@pytest.mark.limit_gpu_leaks("1 MiB")
def test_leaks():
    KEPT.append(device_alloc(3 << 20))  # LINE:leak
    device_free(device_alloc(1 << 20))

def workspace():
    if not CACHE:  # allocated once, kept: a library's lazy workspace
        CACHE.append(device_alloc(4 << 20))  # LINE:cache
    return CACHE[0]

@pytest.mark.limit_gpu_leaks("512KB", warmups=1)
def test_warmup_forgiven():
    workspace()
    device_free(device_alloc(2 << 20))

@pytest.mark.limit_gpu_leaks("512KB")
def test_cache_without_warmup():
    CACHE2.append(device_alloc(4 << 20)) if not CACHE2 else None  # LINE:cache2

CACHE2 = []

def test_environment():
    print("REEXEC=%s" % os.environ.get("CUDATRACE_PYTEST_REEXEC"))
"""


def line_of(tag: str) -> int:
    text = SUITE.lstrip("\n")  # as pytester writes it
    return next(i for i, line in enumerate(text.splitlines(), 1) if f"# LINE:{tag}" in line)


def plugin_args() -> list[str]:
    """`-p cudatrace.pytest_plugin` where the installed metadata lacks the entry point (an
    editable install made before it existed); nothing where pytest loads it itself."""
    eps = metadata.entry_points()
    group = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    if any(ep.value == "cudatrace.pytest_plugin" for ep in group):
        return []
    return ["-p", "cudatrace.pytest_plugin"]


@pytest.fixture
def suite(pytester, sim, monkeypatch):
    for k, v in sim.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("CUDATRACE_DIR", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("CUDATRACE_CACHE", str(pytester.path / "symcache"))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_gpu=SUITE)
    return pytester


def _outcomes(result) -> dict:
    return {k: v for k, v in result.parseoutcomes().items() if v}


def check_suite_result(result, js):
    text = result.stdout.str()
    assert _outcomes(result) == {"passed": 4, "failed": 3}, text
    # the failures name the test's own allocating line, with exact bytes
    assert "limited to 2.00 MiB (2,097,152 B) of device memory but its allocations " in text
    assert "reached 4.00 MiB (4,194,304 B) at their peak" in text
    assert "3.00 MiB (3,145,728 B) in 1 allocation at " in text
    assert f"test_gpu.py:{line_of('over')} in test_over_limit" in text
    assert f"test_gpu.py:{line_of('over') - 1} in test_over_limit" in text
    assert "left 3.00 MiB (3,145,728 B)" in text
    leak = text.split("_ test_leaks _")[1]
    assert "3.00 MiB (3,145,728 B) in 1 allocation at " in leak
    assert f"test_gpu.py:{line_of('leak')} in test_leaks" in leak
    assert "pytest_pyfunc_call" not in leak  # the stack stops at the test
    assert f"test_gpu.py:{line_of('cache2')} in test_cache_without_warmup" in text
    assert "test_warmup_forgiven" not in text.split("short test summary")[1]
    # the end-of-run summary
    assert "cudatrace: highest device-memory peaks" in text
    doc = json.loads(js.read_text())
    tests = {t["nodeid"].split("::")[1]: t for t in doc["tests"]}
    assert set(tests) == {
        "test_plain",
        "test_under_limit",
        "test_over_limit",
        "test_leaks",
        "test_warmup_forgiven",
        "test_cache_without_warmup",
        "test_environment",
    }
    assert (tests["test_plain"]["peak"], tests["test_plain"]["left"]) == (MiB, 0)
    assert (tests["test_over_limit"]["peak"], tests["test_over_limit"]["left"]) == (4 * MiB, 0)
    assert tests["test_over_limit"]["limit_gpu_memory"] == 2 * MiB
    assert tests["test_over_limit"].get("failed") is True
    assert (tests["test_leaks"]["peak"], tests["test_leaks"]["left"]) == (4 * MiB, 3 * MiB)
    w = tests["test_warmup_forgiven"]
    assert (w["peak"], w["left"], w["warmups"], w["limit_gpu_leaks"]) == (2 * MiB, 0, 1, 512000)
    assert tests["test_cache_without_warmup"]["left"] == 4 * MiB
    return text


def test_reexec_limits_leaks_warmups(suite, tmp_path):
    js, keep = tmp_path / "gpu.json", tmp_path / "traces"
    r = suite.runpytest_subprocess(
        *plugin_args(),
        "--cudatrace",
        "--cudatrace-json",
        js,
        "--cudatrace-dir",
        keep,
        "--cudatrace-top",
        "3",
        "-s",
    )
    text = check_suite_result(r, js)
    assert "REEXEC=1" in text  # executed again under the shim
    assert f"cudatrace: traces in {keep}" in text
    assert list(keep.glob("*.ctrace"))
    # three lines, highest peak first (4 MiB each: by node id), then the traces' place
    top = text.split("cudatrace: highest device-memory peaks")[1].splitlines()[1:5]
    assert [x.split()[-1].split("::")[1] for x in top[:3]] == [
        "test_cache_without_warmup",
        "test_leaks",
        "test_over_limit",
    ]
    assert top[0].split()[:4] == ["4.00", "MiB", "peak", "4.00"]
    assert top[3].startswith("cudatrace: traces in")


def test_ini_enables_and_temp_traces_removed(suite, tmp_path):
    suite.makeini("[pytest]\ncudatrace = true\n")
    js = tmp_path / "gpu.json"
    r = suite.runpytest_subprocess(*plugin_args(), "--cudatrace-json", js)
    check_suite_result(r, js)
    d = json.loads(js.read_text())["trace_dir"]
    assert d and not os.path.exists(d)  # the temporary trace directory is gone


def test_xdist_workers_inherit_the_shim(suite, tmp_path):
    js = tmp_path / "gpu.json"
    r = suite.runpytest_subprocess(*plugin_args(), "--cudatrace", "-n", "2", "--cudatrace-json", js)
    check_suite_result(r, js)
    assert "2 workers" in r.stdout.str()


def test_already_traced_runs_in_place(suite, ct, tmp_path):
    js, out = tmp_path / "gpu.json", tmp_path / "run"
    env = dict(os.environ)
    r = ct.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *plugin_args(),
            "--cudatrace",
            "-s",
            "--cudatrace-json",
            js,
        ],
        "-q",
        out=out,
        env=env,
    )
    assert "REEXEC=None" in r.stdout, r.stdout + r.stderr
    assert "4 passed" in r.stdout and "3 failed" in r.stdout, r.stdout
    doc = json.loads(js.read_text())
    assert doc["trace_dir"] == str(out)


def test_inert_without_the_option(suite):
    r = suite.runpytest_subprocess(*plugin_args(), "-s", "-k", "over_limit or environment")
    r.assert_outcomes(passed=2)
    assert "REEXEC=None" in r.stdout.str() and "cudatrace:" not in r.stdout.str()


BAD_MARKERS = {
    "test_unit": ('limit_gpu_memory("2 parsecs")', "limit_gpu_memory: '2 parsecs': unknown unit"),
    "test_number": ("limit_gpu_memory(2048)", "limit_gpu_memory takes one size, as a string"),
    "test_warmups": (
        'limit_gpu_leaks("1 MiB", warmups=-1)',
        "limit_gpu_leaks: warmups must be a whole number >= 0 (got -1)",
    ),
    "test_keyword": ('limit_gpu_leaks("1 MiB", warmup=1)', "limit_gpu_leaks takes warmups= only"),
}


def test_bad_markers_are_collection_errors(pytester):
    for name, (marker, _) in BAD_MARKERS.items():
        pytester.makepyfile(
            **{name: f"import pytest\n\n@pytest.mark.{marker}\ndef test_x():\n    pass\n"}
        )
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin_args(), "--cudatrace", "-p", "no:cacheprovider"],
        cwd=pytester.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    for name, (_, why) in BAD_MARKERS.items():
        part = p.stdout.split(f"ERROR collecting {name}.py")[1].split("\n")[1]
        assert part.startswith(f"test_x: {why}"), (name, p.stdout)


def test_in_process_pytest_cannot_be_reexecuted(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    r = pytester.runpytest_inprocess(*plugin_args(), "--cudatrace")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "cudatrace: --cudatrace cannot load the shim into a pytest started from Python "
        "(pytest.main): run it as `cudatrace run -- python -m pytest --cudatrace ...`"
    ) in r.stderr.str()


MORE_CONFTEST = (
    CONFTEST
    + r"""
import pytest

def pytest_collection_modifyitems(items):
    for it in items:
        if it.name == "test_marked_later":
            it.add_marker(pytest.mark.limit_gpu_memory("1 MiB"))
"""
)

MORE_SUITE = r"""
import subprocess, sys, textwrap, unittest
import pytest
from conftest import device_alloc, device_free

GARBAGE = []
KEPT = []

class TestUnit(unittest.TestCase):
    @pytest.mark.limit_gpu_leaks("1 MiB")
    def test_unittest_leak(self):
        KEPT.append(device_alloc(3 << 20))  # LINE:unit

def test_marked_later():
    device_free(device_alloc(2 << 20))

@pytest.mark.limit_gpu_leaks("0")
def test_zero_leaks_allowed():
    device_free(device_alloc(1 << 20))

@pytest.mark.limit_gpu_leaks("0 B")
def test_zero_leaks_caught():
    KEPT.append(device_alloc(1 << 20))

def test_makes_garbage():
    GARBAGE.append(device_alloc(8 << 20))

@pytest.mark.limit_gpu_leaks("1 MiB")
def test_own_leak_while_garbage_goes():
    device_free(GARBAGE.pop())  # an earlier test's memory, freed during this one
    KEPT.append(device_alloc(8 << 20))  # LINE:own

CHILD = textwrap.dedent('''
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuInit(0)
    d = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(d), 0)
    c = ctypes.c_void_p(); cuda.cuCtxCreate_v2(ctypes.byref(c), 0, d)
    p = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(5 << 20)) == 0
''')

def test_worker_process_allocates():
    subprocess.run([sys.executable, "-c", CHILD], check=True)
"""


def test_markers_when_run_own_figures_and_child_processes(pytester, sim, monkeypatch, tmp_path):
    for k, v in sim.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("CUDATRACE_DIR", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("CUDATRACE_CACHE", str(pytester.path / "symcache"))
    pytester.makeconftest(MORE_CONFTEST)
    pytester.makepyfile(test_more=MORE_SUITE)
    js = tmp_path / "gpu.json"
    r = pytester.runpytest_subprocess(*plugin_args(), "--cudatrace", "--cudatrace-json", js)
    text = r.stdout.str()
    src = MORE_SUITE.lstrip("\n").splitlines()
    line = {t: next(i for i, x in enumerate(src, 1) if f"# LINE:{t}" in x) for t in ("unit", "own")}
    assert _outcomes(r) == {"passed": 3, "failed": 4}, text
    fails = text.split("short test summary")[1]
    for name in ("test_unittest_leak", "test_marked_later", "test_zero_leaks_caught",
                 "test_own_leak_while_garbage_goes"):  # fmt: skip
        assert name in fails, (name, text)
    # a unittest.TestCase method's marker, and one added in pytest_collection_modifyitems
    assert f"test_more.py:{line['unit']} in TestUnit.test_unittest_leak" in text
    assert "limited to 1.00 MiB (1,048,576 B) of device memory but its allocations reached " in text
    # the test's own 8 MiB, though 8 MiB of an earlier test was freed during it
    own = text.split("_ test_own_leak_while_garbage_goes _")[1]
    assert "left 8.00 MiB (8,388,608 B)" in own, own
    assert f"test_more.py:{line['own']} in test_own_leak_while_garbage_goes" in own
    tests = {t["nodeid"].split("::")[-1]: t for t in json.loads(js.read_text())["tests"]}
    assert (tests["test_zero_leaks_allowed"]["left"], tests["test_zero_leaks_caught"]["left"]) == (
        0, MiB)  # fmt: skip
    assert tests["test_zero_leaks_allowed"]["limit_gpu_leaks"] == 0
    g = tests["test_own_leak_while_garbage_goes"]
    assert (g["peak"], g["left"]) == (8 * MiB, 8 * MiB) and g["start_live"] == g["end_live"], g
    # a process the test started allocated: said, not counted in the test's figures
    w = tests["test_worker_process_allocates"]
    assert (w["peak"], w["left"]) == (0, 0)
    assert [p["peak"] for p in w["processes"]] == [5 * MiB], w
    assert "tests whose processes allocated device memory" in text
    assert f"pid {w['processes'][0]['pid']} 5.00 MiB" in text
    assert "no CUDA driver was loaded" not in text


def test_without_a_driver_says_how_to_get_one(pytester, monkeypatch):
    for k in ("LD_PRELOAD", "CUDATRACE_DIR", "LD_LIBRARY_PATH"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    pytester.makepyfile(test_plain="def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    r = pytester.runpytest_subprocess(*plugin_args(), "--cudatrace")
    text = r.stdout.str()
    assert _outcomes(r) == {"passed": 2}, text
    hint = "no CUDA driver was loaded in the tests' processes"
    assert text.count(hint) == 1, text
    assert "simdriver.build" in text and "LD_LIBRARY_PATH=/tmp/sim/lib" in text


def _plain_pytest(pytester, *args):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("CUDATRACE_DIR", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *plugin_args(),
            "--cudatrace",
            "-p",
            "no:cacheprovider",
            *map(str, args),
        ],  # fmt: skip
        cwd=pytester.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_output_paths_are_refused_before_the_run_or_said_after_it(pytester, tmp_path):
    pytester.makepyfile(test_x="def test_x():\n    print('RAN')\n")
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    held = tmp_path / "held"
    held.mkdir()
    (held / "123.0.ctrace").write_bytes(b"")
    refused = {
        "link": (["--cudatrace-json", link], "is a symbolic link"),
        "missing": (["--cudatrace-json", tmp_path / "no" / "gpu.json"], "does not exist"),
        "dir": (["--cudatrace-json", tmp_path], "is a directory"),
        "devnull": (["--cudatrace-dir", "/dev/null"], "exists and is not a directory"),
        "held": (["--cudatrace-dir", held], "already holds traces (123.0.ctrace)"),
    }
    for name, (args, why) in refused.items():
        p = _plain_pytest(pytester, *args, "-s")
        out = p.stdout + p.stderr
        assert p.returncode == pytest.ExitCode.USAGE_ERROR, (name, out)
        assert why in p.stderr and "Traceback" not in out and "INTERNALERROR" not in out, (
            name, out)  # fmt: skip
        assert "RAN" not in p.stdout, (name, out)  # refused before any test ran
    assert not (tmp_path / "elsewhere.json").exists()  # never written through the link
    assert [x.name for x in held.iterdir()] == ["123.0.ctrace"]  # nothing appended
    p = _plain_pytest(pytester, "--cudatrace-json", "/dev/full", "-s")
    out = p.stdout + p.stderr
    assert "RAN" in p.stdout and "1 passed" in p.stdout, out
    assert "cudatrace: --cudatrace-json: cannot write /dev/full: No space left on device" in out
    assert p.returncode == pytest.ExitCode.USAGE_ERROR and "Traceback" not in out, out
