"""The cffi view parsed once (cudatrace/native.py): cffi's out-of-line module of the headers'
CFFI sections, written beside the libraries, read by every later process instead of parsing
the headers again; the same layouts as a fresh parse, and missing symbols as AttributeError,
as the in-line view has them."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import cffi
import pytest

from cudatrace import native
from support.paths import REPO


def _load(path):
    spec = importlib.util.spec_from_file_location(native.VIEW_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return native._InlineLike(module.ffi)


def test_the_view_has_the_parsed_layouts(tmp_path):
    path = native.build_view(tmp_path)
    assert path.name.startswith("ffi_view_") and path.parent == tmp_path
    view = _load(path)
    parsed = cffi.FFI()
    parsed.cdef(native.cffi_source(), packed=False)
    structs = set(re.findall(r"\bstruct (ct_\w+) \{", native.cffi_source()))
    assert {"ct_file_header", "ct_event", "ct_ledger_header"} <= structs
    for s in structs:
        t, p = view.typeof(f"struct {s}"), parsed.typeof(f"struct {s}")
        assert view.sizeof(t) == parsed.sizeof(p), s
        assert [(n, f.offset) for n, f in t.fields] == [(n, f.offset) for n, f in p.fields], s


def test_a_missing_symbol_is_an_attribute_error(tmp_path):
    view = _load(native.build_view(tmp_path))
    lib = view.dlopen(str(native.ensure_built() / native.TOOLS_LIB))
    assert (
        lib.ct_replay_run
        and lib.CT_LEDGER_MAX_DEVICES == native.constants()["CT_LEDGER_MAX_DEVICES"]
    )
    with pytest.raises(AttributeError):
        _ = lib.no_such_function_here


def test_a_command_reads_the_view_without_parsing():
    native.ffi()  # writes the view in this checkout when it is not there
    code = (
        "import sys; from cudatrace import native; native.ffi(); print('pycparser' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
