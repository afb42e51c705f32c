"""Call sites: stacks symbolized, CUDA's own frames folded, allocations grouped.

Every report command groups allocations through here, so `report`, `diff` and the summary of
`cudatrace run` agree on what a site is: the first N frames outside the folded libraries (the
shim, libcuda, the CUDA runtime shared or linked in statically, NVML), symbolized offline from
the module map in the trace.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field

from .model import API, Alloc, Model
from .trace import Trace

FOLD_MODULES = re.compile(r"^(libcuda\.so|libcudart\.so|libcudatrace|libnvidia-ml\.so|"
                          r"libcudadebugger|libnvcuda)")
FOLD_FUNCTIONS = re.compile(r"^(cuda[A-Z_]|cudart::|__cudart|cu[A-Z][A-Za-z0-9_]*$|"
                            r"libcudart_static|cudaApi)")


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

    def label(self) -> str:
        where = ""
        if self.file:
            where = " (%s:%s)" % (os.path.basename(self.file), self.line if self.line else "?")
        if self.function:
            return self.function + where
        return "%s+0x%x%s" % (os.path.basename(self.module), self.offset, where)

    def key(self) -> tuple:
        """What makes two frames the same across runs and builds: names, not addresses."""
        if self.function:
            return (os.path.basename(self.module), self.function,
                    os.path.basename(self.file) if self.file else None)
        return (os.path.basename(self.module), self.offset)

    def as_json(self) -> dict:
        return {"module": self.module, "function": self.function, "file": self.file,
                "line": self.line, "address": self.address, "offset": self.offset,
                "inlined": self.inlined}


def folded(f: SFrame) -> bool:
    if FOLD_MODULES.match(os.path.basename(f.module)):
        return True
    return bool(f.function and FOLD_FUNCTIONS.match(f.function))


class Stacks:
    """Symbolized stacks of a set of traces, computed once per (trace, leaf)."""

    def __init__(self, traces: list[Trace], symbolizer=None, fold: bool = True):
        self.traces = traces
        self.sym = symbolizer
        self.fold = fold
        self._frames: dict[tuple[int, int], list[SFrame]] = {}

    def prepare(self, keys) -> None:
        """Symbolize every address the given (trace index, leaf) stacks need, module by module."""
        todo = [k for k in set(keys) if k not in self._frames]
        by_module: dict[tuple, set[int]] = {}
        raw: dict[tuple[int, int], list[tuple[int, object]]] = {}
        for ti, leaf in todo:
            t = self.traces[ti]
            lst = []
            for ip in t.stack(leaf):
                m = t.module_for(ip)
                lst.append((ip, m))
                if m is not None:
                    by_module.setdefault((m.path, m.build_id, m.base), set()).add(ip - 1)
            raw[(ti, leaf)] = lst
        resolved: dict[tuple, dict[int, list]] = {}
        if self.sym is not None:
            from .symbols import ModuleRef
            for (path, bid, base), addrs in by_module.items():
                try:
                    resolved[(path, bid, base)] = self.sym.symbolize(ModuleRef(path, bid, base), addrs)
                except Exception:          # a symbolizer failure leaves module+offset
                    resolved[(path, bid, base)] = {}
        for key, lst in raw.items():
            frames: list[SFrame] = []
            for ip, m in lst:
                if m is None:
                    frames.append(SFrame("?", None, None, None, ip, ip))
                    continue
                got = resolved.get((m.path, m.build_id, m.base), {}).get(ip - 1)
                if got:
                    for fr in got:
                        frames.append(SFrame(m.path, fr.function, fr.file, fr.line, ip,
                                             ip - m.base, fr.inlined))
                else:
                    frames.append(SFrame(m.path, None, None, None, ip, ip - m.base))
            self._frames[key] = frames

    def frames(self, ti: int, leaf: int) -> list[SFrame]:
        key = (ti, leaf)
        if key not in self._frames:
            self.prepare([key])
        fr = self._frames[key]
        if not self.fold:
            return fr
        kept = [f for f in fr if not folded(f)]
        return kept


@dataclass
class Site:
    key: tuple
    frames: list[SFrame]
    bytes: int = 0
    count: int = 0
    apis: Counter = field(default_factory=Counter)
    sizes: list[int] = field(default_factory=list)
    pids: set = field(default_factory=set)
    devices: set = field(default_factory=set)

    def label(self) -> str:
        return self.frames[0].label() if self.frames else "(no stack: --stack-depth 0 or none recorded)"

    def size_summary(self) -> dict:
        s = sorted(self.sizes)
        if not s:
            return {}
        return {"min": s[0], "median": s[len(s) // 2], "max": s[-1]}


def api_label(model: Model, a: Alloc) -> str:
    t = model.traces[a.trace]
    name = t.api_name(a.event[API])
    rt = a.event[10]
    if rt:
        name += " (%s)" % t.api_name(rt)
    return name


def group(model: Model, allocs: list[Alloc], stacks: Stacks, by: str = "site",
          depth: int = 1) -> list[Site]:
    """Group allocations; sites sorted by bytes, largest first."""
    if by == "site":
        stacks.prepare({(a.trace, a.stack) for a in allocs})
    sites: dict[tuple, Site] = {}
    for a in allocs:
        t = model.traces[a.trace]
        if by == "site":
            fr = stacks.frames(a.trace, a.stack)[:depth]
            key = tuple(f.key() for f in fr)
        elif by == "api":
            fr = []
            key = (t.api_name(a.event[API]),)
        elif by == "library":
            full = stacks.frames(a.trace, a.stack)
            fr = full[:1]
            key = (os.path.basename(full[0].module) if full else "?",)
        elif by == "process":
            fr = []
            key = ("pid %d (%s)" % (t.pid, os.path.basename(t.exe) or "?"),)
        else:
            raise ValueError("unknown grouping %r" % by)
        s = sites.get(key)
        if s is None:
            s = sites[key] = Site(key, list(fr))
        s.bytes += a.size
        s.count += 1
        s.apis[api_label(model, a)] += 1
        s.sizes.append(a.size)
        s.pids.add(t.pid)
        s.devices.add(a.device)
    return sorted(sites.values(), key=lambda s: (-s.bytes, -s.count))


def make_symbolizer(progress: bool = False):
    """The offline symbolizer, with its on-disk cache; None if pyelftools is missing."""
    try:
        from .symbols import Symbolizer
    except ImportError:
        return None
    cache = os.environ.get("CUDATRACE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cudatrace", "symbols")
    try:
        return Symbolizer(cache_dir=cache, progress=progress)
    except Exception:
        return Symbolizer(cache_dir=None, progress=progress)
