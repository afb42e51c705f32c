"""Stacks: each (trace, leaf) stack symbolized offline from the module map in the trace, CUDA's
own frames folded (the shim, libcuda, the CUDA runtime shared or linked in statically, NVML),
Python's frames merged in, allocator layers split off (layers.py): what group.py makes sites
of, and SFrame, one frame as every report shows it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ... import frameworks, settings
from ...symbols import ModuleRef, Symbolizer
from ...symbols import python as pyframes
from ...symbols.symbolizer import ProgressFactory
from ..read.trace import Module, Trace
from .layers import (
    SYSTEM_FUNCTIONS,
    SYSTEM_MODULES,
    TRANSPARENT,
    BFrame,
    CallGraph,
    boundary_split,
)
from .names import comprehension_owner, display_name, enclosing, short_name

FOLD_MODULES = re.compile(
    r"^(libcuda\.so|libcudart\.so|libcudatrace|libnvidia-ml\.so|"
    r"libcudadebugger|libnvcuda)"
)
FOLD_FUNCTIONS = re.compile(
    r"^(cuda[A-Z_]|cudart::|__cudart|cu[A-Z][A-Za-z0-9_]*$|"
    r"libcudart_static|cudaApi)"
)

EXE = "(exe)"  # the module token of a program's own executable (SFrame.module_token)
VIEWS = ("hybrid", "python", "native")
# Python's own call machinery between a Python line and the native code it called: folded when
# the stack has Python frames (the interpreter itself is matched by its eval loop's module too)
PY_GLUE_MODULES = re.compile(r"^(libpython3|python3|libffi\.so|_ctypes\.|_ctypes_test\.)")
ONLY_CUDA = "(only CUDA library frames: use --show-cuda-frames)"


@dataclass(frozen=True)
class SFrame:
    """One symbolized frame, as reports show it."""

    module: str
    function: str | None
    file: str | None
    line: int | None
    address: int
    offset: int
    inlined: bool = False
    python: bool = False  # a Python frame: module = the .py file, offset = instruction
    exe: bool = False  # in the program's own executable (whatever its file is named)
    # its label keeps template arguments: they alone tell its site from another (group)
    templates: bool = False

    @classmethod
    def of_python(cls, f: pyframes.PyFrame) -> SFrame:
        c = f.code
        return cls(c.filename, c.qualname, c.filename, f.line, 0, f.lasti, False, True)

    def label(self, full: bool = False) -> str:
        """`function (file:line)`, the name shortened unless full; `module+0xoffset` when the
        frame could not be symbolized."""
        where = ""
        if self.file:
            where = " ({}:{})".format(os.path.basename(self.file), self.line if self.line else "?")
        if self.function:
            return self.name(full) + where
        return f"{os.path.basename(self.module)}+0x{self.offset:x}{where}"

    def name(self, full: bool = False) -> str:
        """The function's display name alone (module+0xoffset when unknown)."""
        if self.function:
            if self.templates and not full and not self.python:
                return short_name(self.function, templates=True) or self.function
            return display_name(self.function, full)
        return f"{os.path.basename(self.module)}+0x{self.offset:x}"

    def long_label(self, full: bool = False) -> str:
        """label plus the module, for stack listings."""
        if self.function:
            return f"{self.label(full)}  [{os.path.basename(self.module)}]"
        return self.label(full)

    def module_token(self) -> str:
        """The module as identities and keys name it: its basename, or EXE for the program's
        own executable, so `server-b1234` and `server-b1300` (two builds) compare."""
        return EXE if self.exe else os.path.basename(self.module)

    def identity(self) -> tuple[Any, ...]:
        """The function this frame is in, for the call graph (docs/attribution.md): by its
        short name, so a template's instantiations (`DeviceBuffer<float>` and `<int>`) and a
        function's overloads are one function."""
        if self.python:  # a package's path: two packages' `utils.py` are not one module
            return (pyframes.origin(self.file).where, self.function)
        if self.function:
            return (self.module_token(), display_name(self.function))
        return (self.module_token(), self.offset)

    def key(self) -> tuple[Any, ...]:
        """What makes two frames the same across runs and builds: names, not addresses."""
        if self.python:
            w = pyframes.origin(self.file).where
            return (w, self.function, os.path.basename(w))
        if self.function:
            return (
                self.module_token(),
                self.function,
                os.path.basename(self.file) if self.file else None,
            )
        return (self.module_token(), self.offset)

    def as_json(self) -> dict[Any, Any]:
        return {
            "module": self.module,
            "function": self.function,
            "file": self.file,
            "line": self.line,
            "address": self.address,
            "offset": self.offset,
            "inlined": self.inlined,
            "python": self.python,
        }


def _comprehensions(frames: list[SFrame]) -> list[SFrame]:
    """A comprehension's or generator expression's frame named by the function it is written
    in, and that function's own frame just above it dropped (CPython before 3.12 calls a
    comprehension as a function; 3.12 inlines it): a stack reads alike in every version, its
    line the comprehension's."""
    out: list[SFrame] = []
    owner: tuple[str | None, str] | None = None  # pending: the owner's frame to drop
    for f in frames:
        if not f.python:  # the interpreter's own frames between (a builtin ran a generator)
            out.append(f)
            continue
        if owner is not None and (f.file, f.function) == owner:
            owner = None
            continue
        owner = None
        name = comprehension_owner(f.function)
        if name is not None:
            f = replace(f, function=name)
            owner = (f.file, name)
        out.append(f)
    return out


def folded(f: SFrame) -> bool:
    if FOLD_MODULES.match(os.path.basename(f.module)):
        return True
    return bool(f.function and FOLD_FUNCTIONS.match(f.function))


class Stacks:
    """Symbolized stacks of a set of traces, computed once per (trace, leaf)."""

    def __init__(
        self,
        traces: list[Trace],
        symbolizer: Symbolizer | None = None,
        fold: bool = True,
        layers: bool = True,
        patterns: Sequence[Any] = (),
        graph: CallGraph | None = None,
        view: str = "hybrid",
    ) -> None:
        """view: "hybrid" (native frames with the eval loop's replaced by the Python frames it ran),
        "python" (Python frames only; an event without any keeps its native ones) or "native"."""
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}")
        self.traces = traces
        self.sym = symbolizer
        self.fold = fold
        self.view = view
        self._has_py: set[tuple[int, int]] = set()
        self.layers = layers  # fold allocator layers (--no-fold: off)
        self.patterns = list(patterns)  # --fold REGEX, compiled
        self.graph = graph if graph is not None else CallGraph()
        # () -> every (trace, leaf) that allocated
        self._source: Callable[[], Iterable[tuple[int, int]]] | None = None
        self._learned = False
        self._frames: dict[tuple[int, int], list[SFrame]] = {}
        self._kept: dict[tuple[int, int], list[SFrame]] = {}
        # (trace, leaf) -> (the call graph's stamp, via, rest)
        self._split: dict[tuple[int, int], tuple[tuple[int, int], list[SFrame], list[SFrame]]] = {}
        self.errors: list[str] = []
        self._membership: frameworks.Membership | None = None
        self._keys: set[tuple[int, int]] = set()  # stacks grouped without a source
        self._full: dict[tuple[Any, ...], str] = {}  # identity -> a whole name it stands for
        self._heads: tuple[tuple[Any, ...], set[tuple[Any, ...]]] | None = None

    def membership(self) -> frameworks.Membership:
        """Which frames belong to a framework (frameworks.py): the table in force, and the
        libraries the binaries of these traces join to it."""
        if self._membership is None:
            table = frameworks.table()
            exes = {t.exe for t in self.traces if t.exe}
            paths = {m.path for t in self.traces for m in t.modules if m.path not in exes}
            self._membership = frameworks.Membership(table, frameworks.joined_modules(paths, table))
        return self._membership

    def prepare(self, keys: Iterable[tuple[int, int]]) -> None:
        """Symbolize every address the given (trace index, leaf) stacks need, module by module."""
        todo = [k for k in set(keys) if k not in self._frames]
        if not todo:
            return
        by_module: dict[tuple[Any, ...], set[int]] = {}
        raw: dict[tuple[int, int], list[tuple[int, Module | None]]] = {}
        for ti, leaf in todo:
            t = self.traces[ti]
            lst = []
            for ip in t.stack(leaf):
                m = t.module_for(ip)
                lst.append((ip, m))
                if m is not None:
                    by_module.setdefault((m.path, m.build_id, m.base), set()).add(ip - 1)
            raw[(ti, leaf)] = lst
        resolved: dict[tuple[Any, ...], dict[int, list[Any]]] = {}
        if self.sym is not None:
            for (path, bid, base), addrs in by_module.items():
                try:
                    resolved[(path, bid, base)] = (
                        self.sym.symbolize(ModuleRef(path, bid, base), sorted(addrs)) or {}
                    )
                except Exception as e:  # a symbolizer failure leaves module+offset
                    self.errors.append(f"{path}: {e}")
                    resolved[(path, bid, base)] = {}
        for key, lst in raw.items():
            frames: list[SFrame] = []
            exe = os.path.basename(self.traces[key[0]].exe or "") or None
            for ip, m in lst:
                if m is None:
                    frames.append(SFrame("?", None, None, None, ip, ip))
                    continue
                got = resolved.get((m.path, m.build_id, m.base), {}).get(ip - 1)
                if got:
                    for fr in got:
                        frames.append(
                            SFrame(
                                m.path,
                                getattr(fr, "function", None),
                                getattr(fr, "file", None),
                                getattr(fr, "line", None),
                                ip,
                                ip - m.base,
                                bool(getattr(fr, "inlined", False)),
                                exe=os.path.basename(m.path) == exe,
                            )
                        )
                else:
                    is_exe = os.path.basename(m.path) == exe
                    frames.append(SFrame(m.path, None, None, None, ip, ip - m.base, exe=is_exe))
            self._frames[key] = self._with_python(key, frames)

    def _with_python(self, key: tuple[int, int], native: list[SFrame]) -> list[SFrame]:
        t = self.traces[key[0]]
        py = t.py_stack(key[1]) if self.view != "native" else []
        if not py:
            return native
        self._has_py.add(key)
        if self.view == "python":
            return _comprehensions([SFrame.of_python(f) for f in py])
        rng = pyframes.parse_range(t.info.get("python.eval_range"))

        def is_eval(f: SFrame) -> bool:
            if rng and rng[0] <= f.address - 1 < rng[1]:
                return True
            return bool(f.function and pyframes.EVAL_FUNCTIONS.match(f.function))

        return _comprehensions(pyframes.merge(native, is_eval, py, SFrame.of_python))

    def has_python(self, ti: int, leaf: int) -> bool:
        self.all_frames(ti, leaf)
        return (ti, leaf) in self._has_py

    def all_frames(self, ti: int, leaf: int) -> list[SFrame]:
        key = (ti, leaf)
        if key not in self._frames:
            self.prepare([key])
        return self._frames[key]

    def frames(self, ti: int, leaf: int) -> list[SFrame]:
        """The stack's frames, innermost first, without the CUDA libraries' own (unless fold is
        off). A stack made only of folded frames keeps its outermost CUDA frame."""
        key = (ti, leaf)
        got = self._kept.get(key)
        if got is None:
            fr = self.all_frames(ti, leaf)
            if not self.fold:
                got = fr
            else:
                glue = self._glue(ti) if key in self._has_py else None
                got = [f for f in fr if not folded(f) and not (glue and not f.python and glue(f))]
                if not got and fr:
                    got = fr[-1:]
            self._kept[key] = got
        return got

    def _glue(self, ti: int) -> Callable[[SFrame], bool]:
        """Frames of Python's own call machinery (interpreter, ctypes, libffi) in trace ti."""
        t = self.traces[ti]
        rng = pyframes.parse_range(t.info.get("python.eval_range"))
        interp = t.module_for(rng[0]) if rng else None
        ipath = interp.path if interp else None

        def glue(f: SFrame) -> bool:
            return f.module == ipath or bool(PY_GLUE_MODULES.match(os.path.basename(f.module)))

        return glue

    # ---- allocator layers (docs/attribution.md) ----

    def set_source(self, keys_fn: Callable[[], Iterable[tuple[int, int]]] | None) -> None:
        """Where the call graph comes from: a function returning every (trace, leaf) stack of
        the run's allocations; read on the first attribution."""
        self._source = keys_fn
        self._learned = False

    def learn(self, keys: Iterable[tuple[int, int]]) -> None:
        """Add these (trace, leaf) stacks to the call graph."""
        keys = [k for k in set(keys) if k[1]]
        self.prepare(keys)
        for k in keys:  # a function's whole name, for the layers' list with --full-names
            for f in self.frames(*k):
                if f.function and not f.python:
                    self._full.setdefault(f.identity(), f.function)
        self.graph.add(tuple(f.identity() for f in self.frames(*k)) for k in keys)
        if self.layers:
            self._learn_fan(keys)

    def learn_if_alone(self, keys: Iterable[tuple[int, int]]) -> None:
        """Stacks used without a source (no Analysis around them) learn the call graph from
        the stacks they are asked to group (and tell their sites apart among them)."""
        if self._source is None:
            self._keys.update(k for k in keys if k[1])
            if self.layers:
                self.learn(keys)

    def _ensure_graph(self) -> None:
        if not self._learned:
            self._learned = True
            if self._source is not None:
                self.learn(self._source())

    def _matches(self, f: SFrame, negative: bool) -> bool:
        pats = [p for p in self.patterns if getattr(p, "negative", False) == negative]
        if not pats:
            return False
        names = [os.path.basename(f.module)]
        if f.function:
            names += [f.function, display_name(f.function) or f.function]
        return any(p.search(n) for p in pats for n in names)

    def forced(self, f: SFrame) -> bool:
        """--fold: the frame's function (full or short name) or module matches a pattern."""
        return self._matches(f, False)

    def kept(self, f: SFrame) -> bool:
        """--fold '!REGEX': the frame's function is not an allocator."""
        return self._matches(f, True)

    def _boundary(self, ti: int, fr: list[SFrame]) -> tuple[int, int]:
        """The boundary rule's fold over native frames (layers.boundary_split): (cut, the
        allocator's caller below the site, 0 when none)."""
        member = self.membership()
        bf = []
        for f in fr:
            base = os.path.basename(f.module)
            name = display_name(f.function) if f.function else None
            encl = enclosing(f.function) if f.function else None
            bf.append(BFrame(base, name, f.exe, encl, member.of(base, encl or name, f.exe)))
        keep = (lambda i: self.kept(fr[i])) if self.patterns else None
        return boundary_split(bf, keep)

    def _learn_fan(self, keys: Iterable[tuple[int, int]]) -> None:
        """What the boundary rule folds into each site: the callers of the allocator below
        it (the call graph's fan-out, CallGraph.add_fan)."""
        for ti, leaf in keys:
            fr = self.frames(ti, leaf)
            if not fr or any(f.python for f in fr):  # the rule reads native stacks (split)
                continue
            cut, caller = self._boundary(ti, fr)
            if caller:
                self.graph.add_fan(fr[cut].identity(), fr[caller].identity())

    def split(self, ti: int, leaf: int) -> tuple[list[SFrame], list[SFrame]]:
        """(via, rest): the frames folded into allocator layers (innermost first) and the
        stack from the responsible frame up. Without layers (or --no-fold): ([], frames).
        The responsible frame keeps its template arguments where they alone tell its site from
        another (`DeviceBuffer<float>::DeviceBuffer`, `DeviceBuffer<int>::...`)."""
        via, rest = self._split_raw(ti, leaf)
        if rest and rest[0].function and not rest[0].python:
            if rest[0].identity() in self._template_heads():
                rest = [replace(rest[0], templates=True), *rest[1:]]
        return via, rest

    def _template_heads(self) -> set[tuple[Any, ...]]:
        """The functions (identities) that head several sites told apart by their template
        arguments alone, among every stack of the run."""
        stamp = (id(self.graph), self.graph.version, len(self._keys), self._source is not None)
        if self._heads is not None and self._heads[0] == stamp:
            return self._heads[1]
        names: dict[tuple[Any, ...], set[str | None]] = {}
        keys = set(self._keys)
        if self._source is not None:
            keys.update(self._source())
        self.prepare([k for k in keys if k[1]])
        for ti, leaf in keys:
            rest = self._split_raw(ti, leaf)[1] if leaf else []
            if rest and rest[0].function and not rest[0].python:
                names.setdefault(rest[0].identity(), set()).add(
                    short_name(rest[0].function, templates=True)
                )
        heads = {ident for ident, ns in names.items() if len(ns) > 1}
        self._heads = (stamp, heads)
        return heads

    def _split_raw(self, ti: int, leaf: int) -> tuple[list[SFrame], list[SFrame]]:
        key = (ti, leaf)
        fr = self.frames(ti, leaf) if leaf else []
        if not self.layers or not fr:
            return [], fr
        self._ensure_graph()
        got = self._split.get(key)
        stamp = (id(self.graph), self.graph.version)
        if got is not None and got[0] == stamp:
            return got[1], got[2]
        ids = [f.identity() for f in fr]
        # A stack with Python frames: the native frames beneath the innermost Python frame are
        # the implementation of that Python-level call (a framework's binding, its caching
        # allocator, ctypes): the responsible code is Python code, and allocator layers written
        # in Python fold above it like native ones (docs/python-frames.md).
        # The first Python frame outside the installed framework that allocated heads what is
        # left (symbols/python.py framework_end): `cupy.empty` is how the program's line asked.
        p = next((i for i, f in enumerate(fr) if f.python), None)
        p = 0 if p is None else pyframes.framework_end(fr, p)
        forced = (lambda i: self.forced(fr[i + p])) if self.patterns else None
        k = p + self.graph.cut(ids[p:], forced)
        if p == 0 and not fr[0].python:
            # one client is enough when the stack shows where the allocator's code ends; where
            # what it folds fans out into several callers of the allocator, they are the sites
            b, caller = self._boundary(ti, fr)
            if caller and self.graph.fans_out(fr[b].identity()):
                b = caller
            k = max(k, b)
        if self.patterns:  # '!REGEX': the fold stops below a function that is not an allocator
            k = next((i for i in range(k) if self.kept(fr[i])), k)
        if k >= len(fr):  # everything is allocator: the outermost frame asked
            k = len(fr) - 1
        k = self._named_site(fr, k)
        via, rest = fr[:k], fr[k:]
        self._split[key] = (stamp, via, rest)
        return via, rest

    def _named_site(self, fr: list[SFrame], k: int) -> int:
        """A std:: frame (inlined library template) or a frame without a symbol never heads a
        site: the nearest named frame of the caller's code above it does, if there is one
        (a stack with no symbol at all keeps its offsets)."""
        j = k
        while j < len(fr) and not fr[j].python and not self._nameable(fr[j]):
            if self.patterns and self.kept(fr[j]):
                return k
            j += 1
        if j >= len(fr) or (
            not fr[j].python
            and (
                SYSTEM_MODULES.match(os.path.basename(fr[j].module))
                or fr[j].function in SYSTEM_FUNCTIONS
            )
        ):
            return k  # only the C library above: a stripped program keeps its offsets
        return j

    @staticmethod
    def _nameable(f: SFrame) -> bool:
        return bool(f.function) and not TRANSPARENT.match(display_name(f.function) or "")

    def site_frames(self, ti: int, leaf: int) -> list[SFrame]:
        """The stack from the responsible frame up (what makes a site)."""
        return self.split(ti, leaf)[1]

    def layer_names(self, full: bool = False) -> list[str]:
        """Functions recognized as allocator layers (display names, sorted)."""
        self._ensure_graph()
        exe = next((os.path.basename(t.exe) for t in self.traces if t.exe), EXE)
        out: set[str] = set()
        for mod, fn in self.graph.layers:
            whole = self._full.get((mod, fn), fn)
            mod = exe if mod == EXE else mod  # the program's own file, as this run names it
            out.add(display_name(whole, full) if isinstance(fn, str) else f"{mod}+0x{fn:x}")
        return sorted(out)


def make_symbolizer(progress: bool | ProgressFactory = False) -> Symbolizer | None:
    """The offline symbolizer, with its on-disk cache; None if it cannot be had."""
    cache = settings.value("CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cudatrace", "symbols"
    )
    try:
        return Symbolizer(cache_dir=cache, progress=progress)
    except Exception:
        try:
            return Symbolizer(cache_dir=None, progress=progress)
        except Exception:
            return None
