"""cudatrace/native_types.py, the typed face of the cffi views, is the headers' functions: one
method per function of the CFFI sections, same name, same parameters, in the same order."""

from __future__ import annotations

import inspect
import re

import pytest

from cudatrace import native, native_types

VIEWS = {
    native_types.ToolsLib: ("ledger.h", "scan.h", "replay.h"),
    native_types.LiveLib: ("live_format.h",),
}
PROTO = re.compile(r"^\s*[A-Za-z_][\w\s*]*?[\s*](\w+)\s*\(([^;{]*?)\)\s*;", re.M | re.S)


def header_functions(headers: tuple[str, ...]) -> dict[str, list[str]]:
    """{function: parameter names} of the CFFI sections of headers."""
    out = {}
    for h in headers:
        text = re.sub(r"/\*.*?\*/", "", native.cffi_part(native.header_text(h)), flags=re.S)
        for name, params in PROTO.findall(text):
            params = " ".join(params.split())
            out[name] = (
                []
                if params in ("", "void")
                else [p.split()[-1].lstrip("*") for p in params.split(",")]
            )
    return out


def protocol_methods(cls: type) -> dict[str, list[str]]:
    """{method: parameter names}; a C name that is a Python keyword ends in _ there (from_)"""
    return {
        name: [p.removesuffix("_") for p in list(inspect.signature(fn).parameters)[1:]]
        for name, fn in vars(cls).items()
        if callable(fn) and not name.startswith("_")
    }


@pytest.mark.parametrize("cls", list(VIEWS), ids=lambda c: c.__name__)
def test_protocol_is_the_headers(cls):
    want = header_functions(VIEWS[cls])
    assert "ct_replay_run" in want or "cudatrace_live" in want
    assert protocol_methods(cls) == want


def test_the_tools_library_has_every_method():
    _, lib = native.tools()
    missing = [n for n in protocol_methods(native_types.ToolsLib) if not hasattr(lib, n)]
    assert not missing


def test_a_header_change_is_seen():
    text = "/* CFFI-BEGIN */\nint32_t ct_new(const char *path, uint64_t n);\n/* CFFI-END */"
    src = re.sub(r"/\*.*?\*/", "", native.cffi_part(text), flags=re.S)
    assert PROTO.findall(src) == [("ct_new", "const char *path, uint64_t n")]
