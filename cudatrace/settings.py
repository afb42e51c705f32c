"""Every environment variable cudatrace reads or sets, as native/include/settings.def declares it.

settings.def is the one declaration (the preload library compiles it, native/shim/util.c); this
module reads the same file. Code names a variable by its ID, never by its name:
`name("DIR")` is "CUDATRACE_DIR", `value("GROUP_WAIT")` the environment's value or the declared
default, `environment(DIR=..., STACK_DEPTH=64)` the variables a launcher sets. An ID that is not
declared raises KeyError (tests/unit/test_native_layout.py also checks every ID the package asks
for). docs/settings.md and docs/DEVELOPING.md's table are written from the declarations
(`markdown_groups`, `markdown_table`: tests/unit/test_settings_docs.py, --update-docs).

The file is found beside the package in a checkout (native/include) or inside it in a wheel
(cudatrace/_native/native/include, copied there by setup.py with the other C sources).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import CudatraceError

PKG_DIR = Path(__file__).resolve().parent
# native/ (its include/, shim/, reader/, common/ and Makefile): in a checkout, then in a wheel
NATIVE_SOURCES = (PKG_DIR.parent / "native", PKG_DIR / "_native" / "native")

PREFIX = "CUDATRACE_"  # the names of cudatrace's own variables begin so

# who sets the variables of a group (CT_GROUP's SETTER)
SETTERS = {
    "CT_BY_USER": "user",  # people: docs/settings.md
    "CT_BY_RUN": "run",  # cudatrace run, for the preload library (or people, by hand)
    "CT_BY_SELF": "self",  # cudatrace's own processes for each other, tests, developers
    "CT_BY_OTHERS": "others",  # another program's variable
}
# who reads a variable (CT_SETTING's READER)
READERS = {"CT_SHIM": "shim", "CT_COMMON": "ledger", "CT_PYTHON": "python"}

_STRING = r'"(?:[^"\\]|\\.)*"'
_GROUP = re.compile(rf"^CT_GROUP\(\s*({_STRING}),\s*(CT_BY_\w+)\s*\)", re.M)
_SETTING = re.compile(
    rf"^CT_SETTING\(\s*(\w+),\s*({_STRING}),\s*(CT_\w+),\s*(NULL|{_STRING}),\s*"
    rf"((?:{_STRING}\s*)+)\)",
    re.M,
)


class SettingsError(CudatraceError):
    """native/include/settings.def is missing or cannot be read."""


@dataclass(frozen=True)
class Group:
    title: str
    setter: str  # a value of SETTERS


@dataclass(frozen=True)
class Setting:
    ident: str  # the ID: CT_SET_<ID> in C, what Python asks for
    name: str  # the variable
    reader: str  # a value of READERS
    default: str | None
    meaning: str
    group: Group


def _c_string(text: str) -> str:
    """The value of adjacent C string literals ("a" "b"), escapes \\" and \\\\ only."""
    parts = re.findall(_STRING, text)
    return "".join(re.sub(r"\\(.)", r"\1", p[1:-1]) for p in parts)


def definition_file() -> Path:
    for src in NATIVE_SOURCES:
        path = src / "include" / "settings.def"
        if path.is_file():
            return path
    raise SettingsError(
        "native/include/settings.def not found beside or inside the package: reinstall cudatrace"
    )


def parse(text: str) -> dict[str, Setting]:
    """{ID: Setting} of a settings.def text, in its order."""
    marks = [(m.start(), "group", m) for m in _GROUP.finditer(text)]
    marks += [(m.start(), "setting", m) for m in _SETTING.finditer(text)]
    group = Group("", "others")
    out: dict[str, Setting] = {}
    for _, kind, m in sorted(marks, key=lambda mark: mark[0]):
        if kind == "group":
            group = Group(_c_string(m.group(1)), SETTERS[m.group(2)])
            continue
        ident, name, reader, default, meaning = m.groups()
        if ident in out:
            raise SettingsError(f"settings.def declares {ident} twice")
        out[ident] = Setting(
            ident=ident,
            name=_c_string(name),
            reader=READERS[reader],
            default=None if default == "NULL" else _c_string(default),
            meaning=_c_string(meaning),
            group=group,
        )
    return out


@functools.lru_cache(maxsize=1)
def declared() -> dict[str, Setting]:
    """{ID: Setting} of native/include/settings.def, in its order (read once)."""
    try:
        return parse(definition_file().read_text())
    except OSError as e:
        raise SettingsError(f"cannot read settings.def: {e}") from None


def setting(ident: str) -> Setting:
    """The declaration of ID; KeyError when settings.def does not declare it."""
    try:
        return declared()[ident]
    except KeyError:
        raise KeyError(f"{ident}: not declared in native/include/settings.def") from None


def name(ident: str) -> str:
    """The variable of ID: name("DIR") == "CUDATRACE_DIR"."""
    return setting(ident).name


def default(ident: str) -> str | None:
    """The declared default of ID (None: none)."""
    return setting(ident).default


def default_text(ident: str) -> str:
    """The declared default of ID (a declaration without one is a KeyError)."""
    d = setting(ident).default
    if d is None:
        raise KeyError(f"{ident} declares no default")
    return d


def default_int(ident: str, base: int = 10) -> int:
    """The declared default of ID as an integer (a declaration without one is a KeyError)."""
    return int(default_text(ident), base)


def value(ident: str, environ: Mapping[str, str] | None = None) -> str | None:
    """What a reader of ID sees: the environment's value when set and not empty, else the
    declared default (the shim's rule, util.c)."""
    env = os.environ if environ is None else environ
    v = env.get(name(ident))
    return v if v else default(ident)


def number(ident: str, environ: Mapping[str, str] | None = None) -> float:
    """value(ID) as a number; the declared default when the value is not one."""
    try:
        return float(value(ident, environ) or "")
    except ValueError:
        return float(default_int(ident))


def environment(**values: str | int | bool | os.PathLike[str]) -> dict[str, str]:
    """{variable: text} for values given by ID: environment(DIR=path, QUIET=True) ==
    {"CUDATRACE_DIR": "...", "CUDATRACE_QUIET": "1"} (a bool is 1 or 0)."""
    return {name(ident): _text(v) for ident, v in values.items()}


def _text(v: str | int | bool | os.PathLike[str]) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return os.fspath(v) if isinstance(v, os.PathLike) else str(v)


# ---- the settings' pages: docs/settings.md and docs/DEVELOPING.md's table ---------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default_cell(s: Setting) -> str:
    return f"`{s.default}`" if s.default is not None else "unset"


def markdown_groups(setters: tuple[str, ...] = ("user", "run")) -> str:
    """The settings set by `setters`, one table per group, the groups of the first setter
    first: docs/settings.md's body."""
    groups: dict[Group, list[Setting]] = {}
    for setter in setters:
        for s in declared().values():
            if s.group.setter == setter:
                groups.setdefault(s.group, []).append(s)
    parts = []
    for g, members in groups.items():
        rows = [f"| `{s.name}` | {_default_cell(s)} | {_cell(s.meaning)} |" for s in members]
        parts.append(
            "\n".join([f"## {g.title}", "", "| variable | default | meaning |", "|---|---|---|"])
            + "\n"
            + "\n".join(rows)
        )
    return "\n\n".join(parts) + "\n"


def markdown_table() -> str:
    """Every declared variable, with who reads it: docs/DEVELOPING.md's table."""
    rows = ["| variable | read by | set by | default | meaning |", "|---|---|---|---|---|"]
    for s in declared().values():
        rows.append(
            f"| `{s.name}` | {s.reader} | {s.group.setter} | {_default_cell(s)} | "
            f"{_cell(s.meaning)} |"
        )
    return "\n".join(rows) + "\n"
