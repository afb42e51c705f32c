"""C++ (Itanium ABI) demangling through libstdc++'s __cxa_demangle, reached with cffi (ABI mode)."""

from __future__ import annotations

import functools
from typing import Any

_demangler: tuple[Any, ...] | bool | None = (
    None  # None: not tried yet; False: unavailable; else (ffi, cxa_demangle, free)
)


def _load_demangler() -> tuple[Any, ...] | bool | None:
    global _demangler
    if _demangler is None:
        try:
            import cffi

            ffi = cffi.FFI()
            ffi.cdef(
                "char *__cxa_demangle(const char *mangled_name, char *output_buffer,"
                " size_t *length, int *status);\n"
                "void free(void *ptr);"
            )
            cxx = ffi.dlopen("libstdc++.so.6")
            try:
                libc = ffi.dlopen("libc.so.6")
            except OSError:
                libc = ffi.dlopen(None)
            _demangler = (ffi, cxx.__cxa_demangle, libc.free)
        except Exception:  # no cffi, no libstdc++: names stay mangled
            _demangler = False
    return _demangler


@functools.lru_cache(maxsize=1 << 16)
def demangle(name: str) -> str:
    """Demangle a C++ (Itanium ABI) symbol name; return it unchanged when it is not one or when
    demangling is unavailable or fails."""
    if not name or not name.startswith("_Z"):
        return name
    d = _load_demangler()
    if not isinstance(d, tuple):
        return name
    ffi, cxa_demangle, free = d
    try:
        status = ffi.new("int *")
        res = cxa_demangle(name.encode("utf-8", "surrogateescape"), ffi.NULL, ffi.NULL, status)
    except Exception:
        return name
    if res == ffi.NULL:
        return name
    try:
        if status[0] != 0:
            return name
        result: str = ffi.string(res).decode("utf-8", "replace")
        return result
    finally:
        free(res)
