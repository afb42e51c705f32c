"""Where the native pieces live, and the one cffi view of native/include.

The preload library (libcudatrace.so) and the tools library (libcudatrace_tools.so: the budget
ledger, the trace scanner and the replay, the ledger being the same C the shim runs) are built
by native/Makefile. The cffi view declares the CFFI sections of native/include/trace_format.h,
ledger.h, scan.h, replay.h and live_format.h (the
in-process counters cudatrace/api.py reads from the preloaded shim). An installed
package carries them in cudatrace/_native/; in a source checkout they are built there on first use.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from . import settings
from .errors import CudatraceError
from .native_types import ToolsLib

if TYPE_CHECKING:
    import cffi  # loaded only to parse the headers, when no view was written (_view)

PKG_DIR = Path(__file__).resolve().parent
NATIVE_DIR = PKG_DIR / "_native"
SHIM_LIB = "libcudatrace.so"
TOOLS_LIB = "libcudatrace_tools.so"

_lock = threading.Lock()
_ffi = None
_tools = None


class NativeError(CudatraceError, RuntimeError):
    """The native libraries could not be found, built or read."""


def source_dir() -> Path | None:
    """The native/ sources (include/, shim/, reader/, common/, Makefile): beside the package in
    a checkout, or shipped inside it (cudatrace/_native/native)."""
    for cand in settings.NATIVE_SOURCES:
        if (cand / "include" / "trace_format.h").is_file():
            return cand
    return None


def sim_source_dir() -> Path | None:
    """The simulated driver's sources (sim/): beside the package in a checkout, or shipped
    inside it (cudatrace/_native/sim)."""
    for cand in (PKG_DIR.parent / "sim", NATIVE_DIR / "sim"):
        if (cand / "libcuda_sim.c").is_file():
            return cand
    return None


def _stale(lib: Path, src: Path) -> bool:
    """lib is missing or older than a source: native/'s C, headers, .def files, Makefile and
    the glibc floor's script, and cudatrace/__init__.py (the version the Makefile stamps into
    the shim)."""
    if not lib.exists():
        return True
    mtime = lib.stat().st_mtime
    sources = [
        p for p in src.rglob("*") if p.suffix in (".c", ".h", ".def", ".py") or p.name == "Makefile"
    ]
    return any(p.stat().st_mtime > mtime for p in [*sources, PKG_DIR / "__init__.py"])


def ensure_built(which: tuple[str, ...] = (SHIM_LIB, TOOLS_LIB)) -> Path:
    """Return the directory holding the libraries, building them from a checkout if needed.
    $CUDATRACE_NATIVE_DIR names another build to use as it is (the sanitizers' build of the
    tests: `make -C native sanitize OUT=DIR`)."""
    other = settings.value("NATIVE_DIR")
    if other:
        missing = [name for name in which if not (Path(other) / name).is_file()]
        if missing:
            raise RuntimeError(f"{settings.name('NATIVE_DIR')}={other} lacks {', '.join(missing)}")
        return Path(other)
    with _lock:
        src = source_dir()
        libs = [NATIVE_DIR / name for name in which]
        in_checkout = src is not None and src == PKG_DIR.parent / "native"
        if src is not None and in_checkout and any(_stale(lib, src) for lib in libs):
            with _build_lock():
                # another process may have built them while this one waited
                if any(_stale(lib, src) for lib in libs):
                    _make(src, libs)
        missing = [str(lib) for lib in libs if not lib.exists()]
        if missing:
            raise NativeError(
                "cudatrace's native libraries are missing ({}); reinstall the package".format(
                    ", ".join(missing)
                )
            )
        return NATIVE_DIR


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """One build at a time across processes (pytest-xdist's workers, two commands started at
    once): make relinks a library by removing it first, so a second process's make, or its check
    that the library exists, could see it missing meanwhile. A user who may not write the
    checkout (a job's user running a root's checkout) locks the file read-only, or not at all
    where it does not exist yet: such a user cannot build there either."""
    path = NATIVE_DIR / ".build.lock"
    try:
        NATIVE_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except PermissionError:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            yield
            return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _make(src: Path, libs: list[Path]) -> None:
    res = subprocess.run(
        ["make", "-s", "-C", str(src), f"OUT={NATIVE_DIR}", f"PYTHON={sys.executable}"]
        + [str(lib) for lib in libs],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise NativeError(
            "building cudatrace's native libraries failed:\n" + res.stdout + res.stderr
        )


def shim_path() -> Path:
    return ensure_built((SHIM_LIB,)) / SHIM_LIB


# The headers whose CFFI sections make up the one cffi view, in dependency order.
CFFI_HEADERS = ("trace_format.h", "ledger.h", "scan.h", "replay.h", "live_format.h")


def header_text(name: str) -> str:
    """The text of native/include/<name>."""
    src = source_dir()
    if src is None:
        raise NativeError(f"native/include/{name} not found")
    return (src / "include" / name).read_text()


def cffi_part(text: str) -> str:
    m = re.search(r"/\* CFFI-BEGIN \*/(.*?)/\* CFFI-END \*/", text, re.S)
    if not m:
        raise NativeError("header has no CFFI section")
    return m.group(1)


def cffi_source() -> str:
    """The CFFI sections of CFFI_HEADERS, concatenated: what ffi() declares."""
    return "\n".join(cffi_part(header_text(name)) for name in CFFI_HEADERS)


def defines(text: str) -> dict[str, int]:
    """The integer #defines of a C text (CT_OP_ALLOC ...): the one parser of them."""
    return {
        m.group(1): int(m.group(2), 0)
        for m in re.finditer(r"^#define\s+(\w+)\s+(-?(?:0x[0-9a-fA-F]+|\d+))\s*$", text, re.M)
    }


def ffi() -> cffi.FFI:
    """A cffi.FFI that knows every struct, constant and function of the CFFI_HEADERS."""
    global _ffi
    with _lock:
        if _ffi is None:
            _ffi = _view()
        return _ffi


# The view parsed once: cffi's out-of-line ABI module of the CFFI sections (pure Python, no
# compiler), written beside the libraries under a name carrying the sections' hash. A process
# loads it in a millisecond instead of parsing the headers (pycparser: tens of milliseconds a
# command). A checkout writes it on first use, a wheel at build (setup.py: write_view).
VIEW_MODULE = "_cudatrace_ffi_view"


def view_path(src: str, folder: Path = NATIVE_DIR) -> Path:
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]
    return folder / f"ffi_view_{digest}.py"


def build_view(folder: Path) -> Path:
    """Write the view of this checkout's headers into folder (setup.py: the wheel's)."""
    import cffi

    src = cffi_source()
    f = cffi.FFI()
    f.cdef(src, packed=False)
    path = view_path(src, folder)
    write_view(f, path)
    return path


def write_view(f: cffi.FFI, path: Path) -> None:
    """The out-of-line module of f at path (written whole: a temporary file renamed)."""
    from cffi import recompiler

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    recompiler.make_py_source(f, VIEW_MODULE, str(tmp))
    os.replace(tmp, path)
    for old in path.parent.glob("ffi_view_*.py"):  # of headers that changed since
        if old != path:
            old.unlink(missing_ok=True)


class _InlineLike:
    """The out-of-line view as the in-line one behaves: its own attributes (new, cast, buffer,
    typeof, NULL ...) as they are, and libraries whose missing symbol is an AttributeError
    (the out-of-line one raises ffi.error), which callers test for."""

    def __init__(self, f: Any) -> None:
        for name in dir(f):
            if not name.startswith("__") and name != "dlopen":
                setattr(self, name, getattr(f, name))
        self._f = f

    def dlopen(self, name: str | None, flags: int = 0) -> Any:
        return _Lib(self._f.dlopen(name, flags), self._f.error)


class _Lib:
    def __init__(self, lib: Any, error: type[Exception]) -> None:
        self._lib, self._error = lib, error

    def __getattr__(self, name: str) -> Any:
        try:
            value = getattr(self._lib, name)
        except self._error as e:
            raise AttributeError(str(e)) from None
        setattr(self, name, value)  # found once: a plain attribute from then on
        return value


def _view() -> cffi.FFI:
    src = cffi_source()
    path = view_path(src)
    if path.is_file():
        try:
            spec = importlib.util.spec_from_file_location(VIEW_MODULE, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            view: cffi.FFI = _InlineLike(module.ffi)
            return view
        except Exception:  # a damaged file: parse, and write it again
            pass
    import cffi

    f = cffi.FFI()
    f.cdef(src, packed=False)
    try:
        write_view(f, path)
    except OSError:  # an installed package's folder may be read-only: parse each time
        pass
    return f


def tools() -> tuple[cffi.FFI, ToolsLib]:
    """The tools library (ledger, trace scanner, replay) loaded through cffi: (ffi, lib)."""
    global _tools
    f = ffi()
    if _tools is None:
        path = ensure_built((TOOLS_LIB,)) / TOOLS_LIB
        with _lock:
            if _tools is None:
                _tools = f.dlopen(str(path))
    return f, cast(ToolsLib, _tools)


def constants() -> dict[str, int]:
    """All integer #defines of the cffi view (CT_OP_ALLOC, CT_LEDGER_*, CT_REPLAY_* ...)."""
    return defines(cffi_source())


def exempt_this_process() -> None:
    """cudatrace observes and launches; it is never a member of a budget: where the job's
    environment preloaded the shim into this process too (a Slurm job's TaskProlog, a
    container's preload), tell it so, before anything reads NVML or the driver through it (it
    would answer with the job's share, and count this process in it). cli.Main calls it."""
    import ctypes

    try:
        ctypes.CDLL(None).cudatrace_exempt()
    except (AttributeError, OSError):
        pass  # not loaded here (the loader refused it), or another version's without it
