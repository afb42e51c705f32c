"""Python frames of a trace, offline: code objects, line tables, hybrid stacks.

The shim records each code object once (PYCODE: file, qualified name, first line, the bytes of
co_linetable) and each Python stack once (PYFRAME nodes: code, instruction index, entry flag);
an event's native stack ends with a link node naming its Python leaf, or why it has none
(docs/python-frames.md). This module turns those into lines and merges them with the native
frames the way memray's hybrid stacks do: each native frame of the eval loop is replaced by
the Python frames that loop call was running.

Imports nothing from cudatrace: the symbols floor.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# layout.h, repeated here only as the names of the values the reader decodes
LINK_TAG = 0x7079000000000000
LINK_MASK = 0xFFFF000000000000
LINK_FRAMES = 1
LINK_WHY = 2
PYF_ENTRY = 1
PYF_NO_OFFSET = 2

WHY = {
    1: "thread has no Python thread state (started from C, never ran Python)",
    2: "interpreter finalizing (another thread's state may be gone)",
    3: "Python version or build not supported",
    4: "Python not initialized (before start-up or after shutdown)",
    5: "thread ran no Python frame at the time",
    6: "thread state inconsistent (not this thread's)",
}

# the eval loop's own function (not its inlined callers such as _PyEval_EvalFrame, which share
# a return address with the function they were inlined into)
EVAL_FUNCTIONS = re.compile(r"^_PyEval_EvalFrameDefault(\.cold|\.part\.\d+|\.constprop\.\d+)*$")


def is_link(ip: int) -> bool:
    return (ip & LINK_MASK) == LINK_TAG


def link_parts(ip: int) -> tuple[int, int]:
    """(kind, value) of a link node's ip."""
    return (ip >> 32) & 0xFFFF, ip & 0xFFFFFFFF


@dataclass
class PyCode:
    id: int
    address: int
    filename: str
    qualname: str
    firstlineno: int
    code_units: int
    linetable: bytes
    _lines: list[Any] | None = field(default=None, repr=False)

    def line_of(self, lasti: int) -> int | None:
        """The line of the instruction at index lasti (2-byte code units)."""
        if self._lines is None:
            self._lines = line_ranges(self.linetable, self.firstlineno)
        off = lasti * 2
        for start, end, line in self._lines:
            if start <= off < end:
                return line
        return None


def _varint(b: bytes, i: int) -> tuple[int, int]:
    val = b[i] & 63
    shift = 0
    while b[i] & 64:
        i += 1
        shift += 6
        val |= (b[i] & 63) << shift
    return val, i + 1


def _svarint(b: bytes, i: int) -> tuple[int, int]:
    v, i = _varint(b, i)
    return (-(v >> 1) if v & 1 else v >> 1), i


def line_ranges(table: bytes, firstlineno: int) -> list[tuple[int, int, int | None]]:
    """Decode a 3.11+ location table (PEP 626/657, Objects/locations.md; the same format in 3.11,
    3.12 and 3.13) into (start byte offset, end byte offset, line or None)."""
    out: list[tuple[int, int, int | None]] = []
    line = firstlineno
    addr = 0
    i, n = 0, len(table)
    try:
        while i < n:
            first = table[i]
            if not first & 0x80:  # not an entry start: a damaged table
                break
            code = (first >> 3) & 15
            length = ((first & 7) + 1) * 2
            i += 1
            if code == 15:  # no location
                ln = None
            elif code == 14:  # long form: line delta, end line, columns
                d, i = _svarint(table, i)
                line += d
                _, i = _varint(table, i)
                _, i = _varint(table, i)
                _, i = _varint(table, i)
                ln = line
            elif code == 13:  # no column
                d, i = _svarint(table, i)
                line += d
                ln = line
            elif code >= 10:  # one-line forms: line delta code-10, two columns
                line += code - 10
                i += 2
                ln = line
            else:  # short form: same line, one column byte
                i += 1
                ln = line
            out.append((addr, addr + length, ln))
            addr += length
    except IndexError:
        pass
    return out


@dataclass(frozen=True)
class PyFrame:
    code: PyCode
    lasti: int
    flags: int

    @property
    def entry(self) -> bool:
        return bool(self.flags & PYF_ENTRY)

    @property
    def line(self) -> int | None:
        if self.flags & PYF_NO_OFFSET:
            return None
        return self.code.line_of(self.lasti)


class PyTables:
    """What one trace recorded about Python: code objects and the Python stack tree."""

    def __init__(self) -> None:
        self.codes: dict[int, PyCode] = {}
        self.parents: list[int] = [0]
        self.code_ids: list[int] = [0]
        self.lasti: list[int] = [0]
        self.flags: list[int] = [0]

    def add_code(self, c: PyCode) -> None:
        self.codes[c.id] = c

    def add_node(self, nid: int, parent: int, code: int, lasti: int, flags: int) -> None:
        while len(self.parents) <= nid:
            self.parents.append(0)
            self.code_ids.append(0)
            self.lasti.append(0)
            self.flags.append(0)
        self.parents[nid], self.code_ids[nid] = parent, code
        self.lasti[nid], self.flags[nid] = lasti, flags

    def stack(self, leaf: int) -> list[PyFrame]:
        """Python frames of a leaf, innermost first."""
        out = []
        guard = 0
        while leaf and leaf < len(self.parents) and guard < 4096:
            c = self.codes.get(self.code_ids[leaf])
            if c is not None:
                out.append(PyFrame(c, self.lasti[leaf], self.flags[leaf]))
            leaf = self.parents[leaf]
            guard += 1
        return out


def groups(frames: list[PyFrame]) -> list[list[PyFrame]]:
    """Split Python frames (innermost first) into the runs one eval-loop call executed: a run
    ends with its entry frame."""
    out: list[list[PyFrame]] = []
    cur: list[PyFrame] = []
    for f in frames:
        cur.append(f)
        if f.entry:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def parse_range(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        a, b = text.split("-")
        return int(a, 16), int(b, 16)
    except ValueError:
        return None


def merge(
    native: list[Any],
    is_eval: Callable[[Any], bool],
    pyframes: list[PyFrame],
    make: Callable[[PyFrame], Any],
) -> list[Any]:
    """The hybrid stack, innermost first: native frames, each eval-loop frame (is_eval(frame))
    replaced by the run of Python frames it executed (make(PyFrame) builds one frame). Runs left
    over (the native stack was cut at its depth) go outermost; native eval frames left over
    (nothing to replace them with) stay."""
    runs = groups(pyframes)
    out: list[Any] = []
    k = 0
    for f in native:
        if k < len(runs) and is_eval(f):
            out.extend(make(p) for p in runs[k])
            k += 1
            continue
        out.append(f)
    for r in runs[k:]:
        out.extend(make(p) for p in r)
    return out


# where a code object's file lies: an installed package (site-packages of a venv, pip or
# conda; dist-packages of Debian's Python), or the interpreter's own library
_INSTALLED = re.compile(r"[/\\](?:site|dist)-packages[/\\]")
_STDLIB = re.compile(r"[/\\]lib(?:64)?[/\\]python3\.\d+t?[/\\]")
_SUFFIXES = (".py", ".pyc", ".so", ".pyd", ".egg", ".zip", ".whl")


@dataclass(frozen=True)
class Origin:
    """Whose code a Python file is. kind: "library" (an installed package; package = its
    top-level name), "stdlib" (the interpreter's own modules, frozen ones included) or
    "program" (anything else: the script, a source tree, an editable install). where: the path
    from the package root for library and stdlib files, the file name otherwise: what makes two
    frames the same function on two machines."""

    kind: str
    package: str | None
    where: str


_origins: dict[str, Origin] = {}


def origin(filename: str | None) -> Origin:
    got = _origins.get(filename or "")
    if got is None:
        got = _origins[filename or ""] = _origin(filename or "")
    return got


def _origin(path: str) -> Origin:
    if path.startswith("<frozen "):
        return Origin("stdlib", None, path)
    parts = _INSTALLED.split(path)
    if len(parts) > 1:
        rel = parts[-1].replace("\\", "/")
        comps = [c for c in rel.split("/") if c]
        # an egg or zip holds the package one level down
        while len(comps) > 1 and comps[0].endswith((".egg", ".zip", ".whl")):
            comps = comps[1:]
        top = comps[0] if comps else rel
        for suf in _SUFFIXES:
            if top.endswith(suf):
                top = top[: -len(suf)].split(".")[0]
                break
        return Origin("library", top, "/".join(comps) or rel)
    parts = _STDLIB.split(path)
    if len(parts) > 1:
        return Origin("stdlib", None, parts[-1].replace("\\", "/"))
    return Origin("program", None, os.path.basename(path) or path)


def one_framework(a: str, b: str) -> bool:
    """Two installed packages of one framework: the same top-level name, or one name extends the
    other with `lib` or `_...` (jax and jaxlib, cupy and cupy_backends), leading underscores
    aside."""
    a, b = a.lstrip("_").lower(), b.lstrip("_").lower()
    if a == b:
        return True
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    rest = long_[len(short) :]
    return bool(short) and long_.startswith(short) and (rest == "lib" or rest.startswith("_"))


def framework_end(frames: list[Any], start: int) -> int:
    """Frames (innermost first; `.python` and `.file` attributes) from `start`, the innermost
    Python frame: the index of the first Python frame outside the framework that allocated, or
    `start` when that frame is the program's or when no frame lies outside.

    The framework is the installed package of the innermost Python frame; its frames, the
    standard library's between them, and the native frames they called are how the framework
    carries out the call of the first frame outside it: the code that asked for the memory
    (CuPy's `cupy.empty`, JAX's `jit` machinery down to its device buffers, under the line of
    the program that called them)."""
    o = origin(frames[start].file)
    if o.kind == "program":
        return start
    fw = o.package
    for i in range(start, len(frames)):
        f = frames[i]
        if not f.python:
            continue
        o = origin(f.file)
        if o.kind == "stdlib":
            continue
        if o.kind == "library" and (fw is None or one_framework(fw, o.package or "")):
            fw = fw or o.package
            continue
        return i
    return start
