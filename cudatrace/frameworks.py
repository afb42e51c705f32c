"""Frameworks: allocators that span several shared objects and namespaces (docs/attribution.md).

The shipped table is native/include/frameworks.def (the shim's denial line reads the same
file, compiled in); a user's file, named by CUDATRACE_FRAMEWORKS, adds entries, replaces one
of the same name, or turns one off. Its lines:

    # a comment
    myengine  modules=libmyengine,libme_cuda  namespaces=me,me_c*  keep=me::kv::
    tvm off

`modules`: prefixes of a library's file name (the next character, if any, is one of `-_.`
or a digit: `libtorch` is libtorch_cuda.so, not libtorchvision.so); `namespaces`: first
qualifiers of the framework's functions (`at` is at::native::empty_cuda, also when an inline
function of its headers was compiled into the program), or prefixes of C names ending in `*`;
`keep`: prefixes of qualified names inside it that ask for memory rather than allocate.

Beyond the names, the binaries say which libraries belong together: a library installed in
the directory of a framework's library, which links it (DT_NEEDED), is the framework's too
(`joined_modules`): the framework's own part. One that links the framework is its client.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from . import settings
from .errors import CudatraceError

_DEF = re.compile(r'CT_FRAMEWORK\(\s*((?:"[^"]*"\s*,?\s*)+)\)', re.S)
_STR = re.compile(r'"([^"]*)"')
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


class FrameworkError(CudatraceError):
    """A frameworks file that cannot be read: its path, line and why."""


@dataclass(frozen=True)
class Framework:
    name: str
    modules: tuple[str, ...]
    namespaces: tuple[str, ...]
    keep: tuple[str, ...] = ()

    def has_module(self, basename: str) -> bool:
        for p in self.modules:
            if basename.startswith(p):
                rest = basename[len(p) :]
                if not rest or rest[0] in "-_." or rest[0].isdigit():
                    return True
        return False

    def has_name(self, name: str) -> bool:
        """A qualified name (short form: `at::native::empty_cuda`) of its namespaces."""
        first = _first_qualifier(name)
        for ns in self.namespaces:
            if ns.endswith("*"):
                if first == name and name.startswith(ns[:-1]):
                    return True
            elif first == ns and first != name:
                return True
        return False

    def keeps(self, name: str) -> bool:
        return any(name.startswith(k) for k in self.keep)

    def line(self) -> str:
        """The entry in the user file's syntax."""
        parts = [self.name, "modules=" + ",".join(self.modules)]
        parts.append("namespaces=" + ",".join(self.namespaces))
        if self.keep:
            parts.append("keep=" + ",".join(self.keep))
        return "  ".join(parts)


def _first_qualifier(name: str) -> str:
    depth = 0
    for i, c in enumerate(name):
        if c in "<({[":
            depth += 1
        elif c in ">)}]" and depth:
            depth -= 1
        elif c == ":" and not depth and name.startswith("::", i):
            return name[:i]
    return name


def parse_def(text: str) -> list[Framework]:
    """The CT_FRAMEWORK entries of frameworks.def (adjacent C strings joined)."""
    out = []
    body = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    for m in _DEF.finditer(body):
        # "a" "b" (C's concatenation) within one argument: join the pieces between commas
        args, cur = [], ""
        for piece in re.split(r'("[^"]*")', m.group(1)):
            if piece.startswith('"'):
                cur += piece[1:-1]
            elif "," in piece:
                args.append(cur)
                cur = ""
        args.append(cur)
        name, mods, nss, keep = (args + ["", "", "", ""])[:4]
        out.append(Framework(name, tuple(mods.split()), tuple(nss.split()), tuple(keep.split())))
    return out


def parse_user(text: str, where: str = "frameworks file") -> tuple[list[Framework], set[str]]:
    """(entries, names turned off) of a user's file; FrameworkError names a bad line."""
    entries: list[Framework] = []
    off: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        name = words[0]
        if not _NAME.match(name):
            raise FrameworkError(f"{where}:{n}: {name!r} is no framework name")
        if words[1:] == ["off"]:
            off.add(name)
            continue
        fields: dict[str, tuple[str, ...]] = {"modules": (), "namespaces": (), "keep": ()}
        for w in words[1:]:
            key, eq, val = w.partition("=")
            if not eq or key not in fields:
                raise FrameworkError(
                    f"{where}:{n}: {w!r}: expected modules=..., namespaces=..., keep=... or off"
                )
            fields[key] = tuple(v for v in val.split(",") if v)
        if not fields["modules"] and not fields["namespaces"]:
            raise FrameworkError(f"{where}:{n}: {name} names no modules= and no namespaces=")
        entries.append(Framework(name, fields["modules"], fields["namespaces"], fields["keep"]))
    return entries, off


@lru_cache(maxsize=1)
def shipped() -> tuple[Framework, ...]:
    from . import native

    return tuple(parse_def(native.header_text("frameworks.def")))


def merge(base: Iterable[Framework], extra: Iterable[Framework], off: set[str]) -> list[Framework]:
    """The table with a user's entries: same name replaces, a new one is added, off removes."""
    by_name = {f.name: f for f in base}
    for f in extra:
        by_name[f.name] = f
    return [f for n, f in by_name.items() if n not in off]


@lru_cache(maxsize=8)
def _user_file(path: str) -> tuple[tuple[Framework, ...], frozenset[str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise FrameworkError(f"{settings.name('FRAMEWORKS')}={path}: {e.strerror or e}") from None
    entries, off = parse_user(text, path)
    return tuple(entries), frozenset(off)


def table(path: str | None = None) -> list[Framework]:
    """The frameworks in force: the shipped table with the user's file (CUDATRACE_FRAMEWORKS,
    or path) applied."""
    path = path if path is not None else settings.value("FRAMEWORKS")
    if not path:
        return list(shipped())
    entries, off = _user_file(path)
    return merge(shipped(), entries, set(off))


class Membership:
    """Which framework a frame belongs to: by its library (the table's prefixes, or a library
    that joined by the binaries' evidence), else by its name's first qualifier; a name a
    framework keeps belongs to none. The program's own executable is no framework's library,
    whatever its file is named (a program called `libtorch_kv`): its frames belong by their
    names only (the framework's header code compiled into it, `torch::empty`)."""

    def __init__(self, frameworks: Iterable[Framework], joined: Mapping[str, str] | None = None):
        self.frameworks = list(frameworks)
        self.joined = dict(joined or {})  # module basename -> framework name
        self._by_module: dict[str, frozenset[str]] = {}

    def of_module(self, basename: str) -> frozenset[str]:
        got = self._by_module.get(basename)
        if got is None:
            names = {f.name for f in self.frameworks if f.has_module(basename)}
            if basename in self.joined:
                names.add(self.joined[basename])
            got = self._by_module[basename] = frozenset(names)
        return got

    def of(self, basename: str, name: str | None, exe: bool = False) -> frozenset[str]:
        """The frameworks of a frame (module basename, short name or None; exe: the module is
        the program's own executable)."""
        fws = frozenset() if exe else self.of_module(basename)
        if not fws and name:
            fws = frozenset(f.name for f in self.frameworks if f.has_name(name))
        if name and fws:
            fws = frozenset(f.name for f in self.frameworks if f.name in fws and not f.keeps(name))
        return fws


# ---- the binaries' evidence: one install directory, linked together -------------------------


@lru_cache(maxsize=512)
def _needed(path: str) -> tuple[str, ...]:
    """The DT_NEEDED names of an ELF file (() when it cannot be read)."""
    try:
        from elftools.elf.dynamic import DynamicSection
        from elftools.elf.elffile import ELFFile

        with open(path, "rb") as f:
            elf = ELFFile(f)
            for sec in elf.iter_sections():
                if isinstance(sec, DynamicSection):
                    return tuple(
                        t.needed  # type: ignore[attr-defined]
                        for t in sec.iter_tags()
                        if t.entry.d_tag == "DT_NEEDED"
                    )
    except Exception:
        return ()
    return ()


def joined_modules(
    paths: Iterable[str], frameworks: Iterable[Framework], exe: str | None = None
) -> dict[str, str]:
    """{basename: framework} for libraries the table does not name but the binaries put in a
    framework: installed in the directory of one of its libraries, which links them
    (DT_NEEDED): the framework's own parts. A library that links the framework is its client
    (onnxruntime-genai beside onnxruntime, the program), never a part; nor is the program's
    own executable."""
    fws = list(frameworks)
    by_dir: dict[str, list[tuple[str, str | None]]] = {}
    for p in set(paths):
        if not p or p == exe or "/" not in p:
            continue
        base = os.path.basename(p)
        owner = next((f.name for f in fws if f.has_module(base)), None)
        by_dir.setdefault(os.path.dirname(p), []).append((p, owner))
    out: dict[str, str] = {}
    for members in by_dir.values():
        needed = {n: o for p, o in members if o for n in _needed(p)}
        for p, o in members:
            base = os.path.basename(p)
            if not o and base in needed:
                out[base] = needed[base]
    return out
