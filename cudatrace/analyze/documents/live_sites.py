"""The sites of a time window of one process's trace: what the in-process API's track() blocks
and the pytest plugin name (cudatrace/api.py). The trace may still be growing: it is read as it
stands, attributed as `cudatrace report` attributes (Python lines first).

block_sites(path, t0, t1, at) -> rows of the allocations made in [t0, t1]:
    at="peak": those live at the moment their sum was highest within the window
    at="end":  those still live at t1
descendant_peaks(directory, pid, t0, t1) -> [(pid, peak)] of the processes started from pid
    (their traces in the same directory) that allocated in [t0, t1]: each one's window peak
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import procfs

if TYPE_CHECKING:
    from ...symbols import Symbolizer
    from ..replay.lives import Alloc
    from ..sites.stacks import SFrame

_lock = threading.Lock()
_symbolizer = None  # kept between calls: a test suite asks many times of the same libraries


def _shared_symbolizer() -> Symbolizer | None:
    global _symbolizer
    with _lock:
        if _symbolizer is None:
            from ..sites.stacks import make_symbolizer

            _symbolizer = make_symbolizer(progress=False)
        return _symbolizer


def window_allocs(lifetimes: Iterable[Alloc], t0: int, t1: int, at: str) -> list[Alloc]:
    """The allocations (model.Alloc) made in [t0, t1] that were live at the window's own peak
    (at="peak") or at t1 (at="end")."""
    mine = [a for a in lifetimes if t0 <= a.ts <= t1]
    if at == "end":
        return [a for a in mine if a.end_ts is None or a.end_ts > t1]
    from ..replay.lives import peak

    _, best_ts = peak(mine, until=t1)
    if best_ts is None:
        return []
    return [a for a in mine if a.ts <= best_ts and (a.end_ts is None or a.end_ts > best_ts)]


def _anchor(frames: list[SFrame], anchor: tuple[str, ...] | None) -> SFrame | None:
    """The innermost Python frame of the anchor (file, function name): the block's own code."""
    if not anchor:
        return None
    file, name = anchor
    for f in frames:
        if (
            f.python
            and f.file == file
            and f.function
            and (f.function == name or f.function.endswith("." + name))
        ):
            return f
    return None


def block_sites(
    path: str | Path | None,
    t0: int,
    t1: int,
    at: str = "peak",
    limit: int = 10,
    anchor: tuple[Any, ...] | None = None,
) -> list[dict[str, Any]]:
    """Rows {label, file, line, function, bytes, count, python, via, stack} of the window's
    allocations (see window_allocs), grouped by site and, when anchor (file, function) is given,
    by the line of that function they came through (a helper that several lines of a test call
    is one site, each line its own row); largest first. [] without a trace."""
    if not path:
        return []
    from ..read.load import load
    from .analysis import Analysis

    a = Analysis(path, td=load(path), symbolizer=_shared_symbolizer())
    chosen = window_allocs(a.model.lifetimes(), t0, t1, at)
    if not chosen:
        return []
    a.sites(chosen)  # prepares the stacks and the allocator layers as a report does
    st = a.stacks
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for x in chosen:
        leaf = x.stack
        site = st.site_frames(x.trace, leaf)[:1] if leaf else []
        ctx = st.frames(x.trace, leaf) if leaf else []
        here = _anchor(ctx, anchor)
        head = here or (site[0] if site else None)
        key = (site[0].key() if site else None, here.line if here else None)
        r = rows.get(key)
        if r is None:
            if any(f.python for f in ctx):  # the Python stack reads best on its own
                ctx = [f for f in ctx if f.python]
            r = rows[key] = {
                "label": site[0].label() if site else "(no stack)",
                "file": head.file if head else None,
                "line": head.line if head else None,
                "function": head.function if head else None,
                "bytes": 0,
                "count": 0,
                "python": bool(head and head.python),
                "via": " > ".join(f.name() for f in reversed(st.split(x.trace, leaf)[0]))
                if leaf
                else "",
                "stack": [(f.function, f.file, f.line) for f in ctx],
            }
        r["bytes"] += x.size
        r["count"] += 1
    out = sorted(rows.values(), key=lambda r: (-r["bytes"], -r["count"], r["label"]))
    return out[: max(1, limit)]


# trace file -> (pid, ppid) of its header, and whether it descends from the asking process
_heads: dict[str, tuple[int, int]] = {}
_descends: dict[tuple[str, int], bool] = {}


def _head(path: str) -> tuple[int, int] | None:
    """(pid, ppid) of a trace file's header; None when it is not (yet) a trace."""
    if path in _heads:
        return _heads[path]
    from ..read.trace import layout

    st, names = layout("struct ct_file_header")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            raw = os.pread(fd, st.size, 0)
        finally:
            os.close(fd)
    except OSError:
        return None
    if len(raw) < st.size or not raw.startswith(b"CUDATRC"):
        return None
    h = dict(zip(names, st.unpack(raw)))
    _heads[path] = (int(h["pid"]), int(h["ppid"]))
    return _heads[path]


def _descends_from(pid: int, ppid: int, me: int, parents: dict[int, int]) -> bool:
    """Whether pid was started from me: its parents' chain, from the traces' headers and, for
    a process without a trace (a fork server), from /proc while it runs."""
    q, seen = ppid, {pid}
    while q > 1 and q not in seen:
        if q == me:
            return True
        seen.add(q)
        nxt = parents.get(q)
        q = nxt if nxt is not None else procfs.parent_of(q) or 0
    return False


def _window_peak(path: str, t0: int, t1: int) -> int:
    from ..read.load import load
    from .analysis import Analysis

    a = Analysis(path, td=load(path), symbolizer=_shared_symbolizer())
    return sum(x.size for x in window_allocs(a.model.lifetimes(), t0, t1, "peak"))


def descendant_peaks(directory: str | None, me: int, t0: int, t1: int) -> list[tuple[int, int]]:
    """[(pid, bytes)] of the processes started from process `me` (children, and theirs), traced
    into `directory`, that allocated device memory in [t0, t1]: the most each held at once of
    what it allocated then. Their memory is not in `me`'s own counters. [] without a directory."""
    if not directory or not os.path.isdir(directory):
        return []
    heads = {}
    for p in sorted(Path(directory).glob("*.ctrace")):
        h = _head(str(p))
        if h is not None and h[0] != me:
            heads[str(p)] = h
    parents = {pid: ppid for pid, ppid in heads.values()}
    out = []
    for path, (pid, ppid) in heads.items():
        key = (path, me)
        if key not in _descends:
            _descends[key] = _descends_from(pid, ppid, me, parents)
        if _descends[key]:
            peak = _window_peak(path, t0, t1)
            if peak:
                out.append((pid, peak))
    return out
