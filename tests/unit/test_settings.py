"""cudatrace/settings.py reads native/include/settings.def: the IDs, names, defaults, groups and
meanings the C compiles, and the values a process sees (the shim's rule: unset or empty is the
default)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cudatrace import settings
from cudatrace.errors import CudatraceError

DEF = r"""
#ifndef CT_GROUP
#define CT_GROUP(TITLE, SETTER)
#endif
CT_GROUP("First", CT_BY_RUN)
CT_SETTING(DIR, "CUDATRACE_DIR", CT_SHIM, NULL,
    "trace directory; a \"quoted\" word")
CT_SETTING(DEPTH, "CUDATRACE_STACK_DEPTH", CT_SHIM, "64", "frames, "
    "on two lines")
CT_GROUP("Second", CT_BY_USER)
CT_SETTING(WAIT, "CUDATRACE_GROUP_WAIT", CT_PYTHON, "30", "seconds")
CT_SETTING(MODE, "CUDATRACE_FILE_MODE", CT_SHIM, "0600", "octal")
"""


def test_parse_reads_ids_names_defaults_groups_and_meanings():
    d = settings.parse(DEF)
    assert list(d) == ["DIR", "DEPTH", "WAIT", "MODE"]
    assert d["DIR"].name == "CUDATRACE_DIR" and d["DIR"].default is None
    assert d["DIR"].meaning == 'trace directory; a "quoted" word'
    assert d["DEPTH"].meaning == "frames, on two lines" and d["DEPTH"].default == "64"
    assert d["DEPTH"].group == settings.Group("First", "run")
    assert d["WAIT"].group == settings.Group("Second", "user") and d["WAIT"].reader == "python"


def test_parse_refuses_an_id_declared_twice():
    with pytest.raises(CudatraceError, match="DIR twice"):
        settings.parse(DEF + 'CT_SETTING(DIR, "X", CT_SHIM, NULL, "again")\n')


def test_the_real_file_declares_the_shims_settings():
    d = settings.declared()
    assert settings.name("DIR") == "CUDATRACE_DIR"
    assert d["STACK_DEPTH"].reader == "shim" and d["LEDGER_DIR"].reader == "ledger"
    assert settings.default_int("STACK_DEPTH") == 64
    assert settings.default_int("FILE_MODE", 8) == 0o600
    with pytest.raises(KeyError, match="NO_SUCH"):
        settings.name("NO_SUCH")
    with pytest.raises(KeyError, match="no default"):
        settings.default_text("DIR")


def test_value_is_the_environment_else_the_default():
    wait = settings.name("GROUP_WAIT")
    assert settings.value("GROUP_WAIT", {}) == settings.default("GROUP_WAIT")
    assert settings.value("GROUP_WAIT", {wait: ""}) == settings.default("GROUP_WAIT")
    assert settings.value("GROUP_WAIT", {wait: "2.5"}) == "2.5"
    assert settings.number("GROUP_WAIT", {wait: "2.5"}) == 2.5
    assert settings.number("GROUP_WAIT", {wait: "soon"}) == settings.default_int("GROUP_WAIT")
    assert settings.value("DIR", {}) is None


def test_environment_names_the_variables_and_writes_flags_as_1_or_0(tmp_path):
    env = settings.environment(DIR=tmp_path, QUIET=True, VIRTUALIZE=False, STACK_DEPTH=8)
    assert env == {
        "CUDATRACE_DIR": str(tmp_path),
        "CUDATRACE_QUIET": "1",
        "CUDATRACE_VIRTUALIZE": "0",
        "CUDATRACE_STACK_DEPTH": "8",
    }
    with pytest.raises(KeyError):
        settings.environment(NOT_DECLARED=1)


def written_names(text: str) -> list[str]:
    """The variables a module writes out as string literals ("CUDATRACE_...")."""
    return re.findall(r"[\"']CUDATRACE_\w+", text)


def test_only_the_settings_module_writes_a_variable_out():
    """Every other module names a variable by its ID (settings.name("DIR"), ...)."""
    pkg = Path(settings.__file__).parent
    found = {
        str(p.relative_to(pkg)): names
        for p in sorted(pkg.rglob("*.py"))
        if p.name != "settings.py" and "_native" not in p.parts
        for names in [written_names(p.read_text())]
        if names
    }
    assert not found, f"name these by ID through cudatrace.settings: {found}"
    assert written_names('env["CUDATRACE_DIR"] = d; x = "CUDATRACE_"') == ['"CUDATRACE_DIR']


def test_the_group_wait_default_is_declared_once():
    """--group's help says the declared default, whatever it is."""
    from click.testing import CliRunner

    from cudatrace.cli import main

    out = CliRunner().invoke(main, ["run", "--help"], terminal_width=400).output
    wait = settings.default_text("GROUP_WAIT")
    assert f"${settings.name('GROUP_WAIT')} s, default {wait}," in " ".join(out.split())
