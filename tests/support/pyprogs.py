"""Python programs the tests run under the shim (tests/integration/test_pyframes.py,
test_python_denials.py): the interpreters to run them with, a ctypes prelude that allocates
through the driver, an installed framework and application, and the lines they mark.

The interpreters are every CPython this machine has (found()): the one running pytest, the
distribution's /usr/bin/python3, each python3.X on PATH, pyenv's under $PYENV_ROOT (pyenv's own
default, ~/.pyenv, when unset), and those tools/install-test-deps.sh adds from other Debian
releases (its --pythons). One parameter per interpreter binary, whichever way it was found
first; a version the tests name that none of them is, is one parameter skipped with the reason,
so the running interpreter is always tested and a missing version always said.

The rule of CI=true (a missing tool fails instead of skipping) holds for the versions
tools/install-test-deps.sh installs: under CI=true a missing one fails. A version that script
cannot install (no registry this project uses has it for Debian 12: 3.10, 3.12) is tested where
a machine has it and skipped, saying so, where it has not, CI included.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.paths import REPO

# the versions whose frames the shim reads (native/shim/pylayouts.h), and older ones it refuses
# with a note
SUPPORTED = ((3, 11), (3, 12), (3, 13))
OLDER = ((3, 9), (3, 10))

PYENV_ROOT = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
PROBE = (
    "import os, sys; "
    "print(sys.implementation.name, *sys.version_info[:3], os.path.realpath(sys.executable))"
)
WHERE = "the running one, /usr/bin/python3, PATH, $PYENV_ROOT, tools/install-test-deps.sh's"


@dataclass(frozen=True)
class Interpreter:
    exe: str  # what the tests run
    version: tuple[int, int, int]
    found: str  # running, system, PATH, pyenv, test-deps
    binary: str  # the interpreter's own file: one parameter per binary

    @property
    def id(self) -> str:
        return "%s-%d.%d.%d" % (self.found, *self.version)


def _is_python3x(p: Path) -> bool:
    return re.fullmatch(r"python3\.\d+", p.name) is not None


@functools.cache
def script_pythons() -> dict[tuple[int, int], str]:
    """The CPythons tools/install-test-deps.sh installs: version -> the path it runs them by."""
    out = subprocess.run(
        [str(REPO / "tools" / "install-test-deps.sh"), "--pythons"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pythons = {}
    for line in out.splitlines():
        version, path = line.split(":", 1)[0].split()
        major, minor = version.split(".")
        pythons[int(major), int(minor)] = path
    return pythons


def _candidates() -> list[tuple[str, str]]:
    out = [(sys.executable, "running"), ("/usr/bin/python3", "system")]
    shims = (PYENV_ROOT / "shims").resolve()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        # pyenv's shims stand for its versions, which are looked at below
        if d and Path(d).is_dir() and Path(d).resolve() != shims:
            out += [(str(p), "PATH") for p in sorted(Path(d).iterdir()) if _is_python3x(p)]
    versions = sorted((PYENV_ROOT / "versions").glob("*/bin/python3.*"))
    out += [(str(p), "pyenv") for p in versions if _is_python3x(p)]
    out += [(path, "test-deps") for path in script_pythons().values()]
    return out


@functools.cache
def found() -> tuple[Interpreter, ...]:
    """Every CPython here, once each (the first way it was found), in the order looked at."""
    out: dict[str, Interpreter] = {}
    for exe, where in _candidates():
        if not os.access(exe, os.X_OK) or os.path.isdir(exe):
            continue
        try:
            r = subprocess.run([exe, "-c", PROBE], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        words = r.stdout.split()
        if r.returncode != 0 or len(words) != 5 or words[0] != "cpython":
            continue  # not a CPython that runs: nothing the tests can use
        version = (int(words[1]), int(words[2]), int(words[3]))
        out.setdefault(words[4], Interpreter(exe, version, where, words[4]))
    return tuple(out.values())


def interpreters(versions: Sequence[tuple[int, int]] = SUPPORTED) -> list[Any]:
    """pytest parameters: each interpreter here of one of these versions, then each version
    none is (skipped saying so; failed under CI=true when tools/install-test-deps.sh installs
    it)."""
    have = [i for i in found() if i.version[:2] in versions]
    out = [pytest.param(i.exe, id=i.id) for i in have]
    for v in versions:
        if any(i.version[:2] == v for i in have):
            continue
        why = "CPython %d.%d not installed here (looked at %s)" % (*v, WHERE)
        if v in script_pythons():
            mark = pytest.mark.python_missing(why, required=os.environ.get("CI") == "true")
        else:
            why += "; tools/install-test-deps.sh does not install it"
            mark = pytest.mark.skip(reason=why)
        out.append(pytest.param(None, id="%d.%d-missing" % v, marks=mark))
    return out


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "python_missing(why, required): a CPython version this machine lacks"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A missing version the test-deps script installs: skipped, or failed under CI=true."""
    m = item.get_closest_marker("python_missing")
    if m is not None:
        if m.kwargs["required"]:
            pytest.fail(m.args[0] + ": run tools/install-test-deps.sh (CI=true: not skipped)")
        pytest.skip(m.args[0])


INTERPRETERS = interpreters(SUPPORTED)
OLDER_INTERPRETERS = interpreters(OLDER)


def version_of(exe: str) -> tuple[int, int]:
    out = subprocess.run(
        [exe, "-c", "import sys; print(*sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]), int(out[1])


PRELUDE = r"""
import ctypes, os, sys
cuda = ctypes.CDLL("libcuda.so.1")          # ctypes releases the GIL around each call
cuda.cuInit(0)
_dev = ctypes.c_int()
cuda.cuDeviceGet(ctypes.byref(_dev), 0)
_ctx = ctypes.c_void_p()
cuda.cuCtxCreate_v2(ctypes.byref(_ctx), 0, _dev)
LIVE = []

def device_alloc(nbytes):
    p = ctypes.c_uint64()
    r = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes))  # LINE:helper
    assert r == 0, r
    LIVE.append(p.value)
    return p.value
"""


def lines_of(src: str) -> dict[str, int]:
    out = {}
    for i, line in enumerate(src.splitlines(), 1):
        if "# LINE:" in line:
            out[line.split("# LINE:")[1].strip()] = i
    return out


# the framework's allocator module: the prelude's device_alloc behind its own malloc
FAKE_ALLOC = (
    PRELUDE
    + r"""
def malloc(nbytes):
    return device_alloc(nbytes)
"""
)

# the stdlib's json decoder between two of the framework's frames (object_hook is called from
# json's C scanner through json/decoder.py)
FAKE_API = r"""
import json
from fakefwlib import mem

def empty(nbytes):
    return json.loads("{}", object_hook=lambda d: mem.malloc(nbytes))
"""

FAKE_APP = r"""
import fakefw

def start_engine():
    return fakefw.empty(7 << 20)  # LINE:app

def main():
    start_engine()
"""


def site_packages(tmp_path: Path) -> Path:
    """An installed framework under tmp_path's site-packages (fakefw over fakefwlib, the
    standard library's json between them) and an installed application calling it (fakeapp)."""
    sp = tmp_path / "venv" / "lib" / "python3" / "site-packages"
    for rel, src in (
        ("fakefwlib/__init__.py", ""),
        ("fakefwlib/mem.py", FAKE_ALLOC),
        ("fakefw/__init__.py", "from fakefw.api import empty\n"),
        ("fakefw/api.py", FAKE_API),
        ("fakefw/selftest.py", "import fakefw\nfakefw.empty(1 << 20)\n"),
        ("fakeapp/__init__.py", ""),
        ("fakeapp/__main__.py", "from fakeapp.engine import main\nmain()\n"),
        ("fakeapp/engine.py", FAKE_APP),
    ):
        p = sp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src)
    return sp
