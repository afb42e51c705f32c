"""Python programs the tests run under the shim (tests/integration/test_pyframes.py,
test_python_denials.py): the interpreters to run them with, a ctypes prelude that allocates
through the driver, an installed framework and application, and the lines they mark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PYENV = Path("/root/.pyenv/versions")
PYENV_VERSIONS = ("3.11.7", "3.12.1", "3.13.0")


def interpreters():
    out = [pytest.param(sys.executable, id="running-%d.%d" % sys.version_info[:2])]
    system = Path("/usr/bin/python3")  # the distribution's build, when there is one
    if system.exists() and system.resolve() != Path(sys.executable).resolve():
        out.append(pytest.param(str(system), id="system"))
    for v in PYENV_VERSIONS:
        minor = ".".join(v.split(".")[:2])
        exe = PYENV / v / "bin" / ("python" + minor)
        out.append(pytest.param(str(exe), id="pyenv-" + v))
    return out


INTERPRETERS = interpreters()


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
