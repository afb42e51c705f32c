"""Where the native pieces live, and the one cffi view of shim/layout.h.

The preload library (libcudatrace.so) and the tools library (libcudatrace_tools.so: the budget
ledger and the trace scanner, the same C the shim runs) are built by shim/Makefile. An installed
package carries them in cudatrace/_native/; in a source checkout they are built there on first use.
"""
from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import cffi

PKG_DIR = Path(__file__).resolve().parent
NATIVE_DIR = PKG_DIR / "_native"
SHIM_LIB = "libcudatrace.so"
TOOLS_LIB = "libcudatrace_tools.so"

_lock = threading.Lock()
_ffi = None
_tools = None


def source_dir() -> Path | None:
    """shim/ sources: shipped inside the package, or beside it in a checkout."""
    for cand in (NATIVE_DIR / "src", PKG_DIR.parent / "shim"):
        if (cand / "layout.h").is_file():
            return cand
    return None


def _stale(lib: Path, src: Path) -> bool:
    if not lib.exists():
        return True
    mtime = lib.stat().st_mtime
    return any(p.stat().st_mtime > mtime for p in src.iterdir() if p.suffix in (".c", ".h", ".def"))


def ensure_built(which: tuple[str, ...] = (SHIM_LIB, TOOLS_LIB)) -> Path:
    """Return the directory holding the libraries, building them from a checkout if needed."""
    with _lock:
        src = source_dir()
        libs = [NATIVE_DIR / name for name in which]
        in_checkout = src is not None and src == PKG_DIR.parent / "shim"
        if in_checkout and any(_stale(lib, src) for lib in libs):
            res = subprocess.run(["make", "-s", "-C", str(src), f"OUT={NATIVE_DIR}"] +
                                 [str(lib) for lib in libs], capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError("building the cudatrace shim failed:\n" + res.stdout + res.stderr)
        missing = [str(lib) for lib in libs if not lib.exists()]
        if missing:
            raise RuntimeError("cudatrace's native libraries are missing (%s); reinstall the package"
                               % ", ".join(missing))
        return NATIVE_DIR


def shim_path() -> Path:
    return ensure_built((SHIM_LIB,)) / SHIM_LIB


def layout_header() -> str:
    src = source_dir()
    if src is None:
        raise RuntimeError("shim/layout.h not found")
    return (src / "layout.h").read_text()


def cffi_part(text: str) -> str:
    m = re.search(r"/\* CFFI-BEGIN \*/(.*?)/\* CFFI-END \*/", text, re.S)
    if not m:
        raise RuntimeError("layout.h has no CFFI section")
    return m.group(1)


def ffi() -> cffi.FFI:
    """A cffi.FFI that knows every struct and constant of shim/layout.h."""
    global _ffi
    with _lock:
        if _ffi is None:
            f = cffi.FFI()
            f.cdef(cffi_part(layout_header()), packed=False)
            _ffi = f
        return _ffi


def tools():
    """The tools library (ledger, trace scanner) loaded through cffi: (ffi, lib)."""
    global _tools
    f = ffi()
    if _tools is None:
        path = ensure_built((TOOLS_LIB,)) / TOOLS_LIB
        with _lock:
            if _tools is None:
                _tools = f.dlopen(str(path))
    return f, _tools


def constants() -> dict[str, int]:
    """All integer #defines of the CFFI section (CT_OP_ALLOC ...)."""
    out = {}
    for m in re.finditer(r"^#define\s+(\w+)\s+(-?(?:0x[0-9a-fA-F]+|\d+))\s*$",
                         cffi_part(layout_header()), re.M):
        out[m.group(1)] = int(m.group(2), 0)
    return out
