"""The in-process API: what cudatrace's shim knows now, read from inside the traced process.

A program running under the shim (`cudatrace run -- python ...`, or pytest with the plugin) reads
the shim's live counters through cffi while it runs: each thread of the program counts on its
own, and every reading sums them (`cudatrace_live()`, a moment's lock of the shim; the layout and
its rules: native/include/live_format.h). docs/pytest.md documents these names; they are
stable:

    active() -> bool                      the shim is loaded and counting
    stats(device=None) -> Row             live bytes, peak since start, counts (None: all devices)
    snapshot() -> Snapshot                every row at once (devices, all, host)
    mark() -> Mark                        a point to measure the peak from (peak(), close())
    track() -> Tracker                    `with track() as t:` the peak of the block's own
                                          allocations, what of them it left live, and the sites
    NotTracedError                        raised when the shim is not loaded; says how to load it

A block's figures are its own allocations, made by any thread of the process while it runs.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import settings
from .closing import Closing
from .errors import CudatraceError

__all__ = [
    "NotTracedError",
    "Row",
    "Snapshot",
    "Mark",
    "Tracker",
    "SiteUse",
    "active",
    "stats",
    "snapshot",
    "mark",
    "track",
]

HOW_TO = (
    "run the program under cudatrace: `cudatrace run -- python ...`, "
    "or pytest with the plugin: `pytest --cudatrace`"
)


class NotTracedError(CudatraceError, RuntimeError):
    """The shim is not loaded in this process (or is pass-through): nothing is counted."""

    def __init__(self, why: str = "cudatrace's shim is not loaded in this process"):
        super().__init__(f"{why}; {HOW_TO}")


_lock = threading.Lock()
# (ffi, lib, live pointer, constants) once found: cffi's objects have no Python types
_View = tuple[Any, Any, Any, dict[str, int]]
_view: _View | None = None
_looked = False
_mismatch: list[str] = []  # why a loaded shim cannot be read, when it cannot


def _load() -> _View | None:
    """(ffi, lib, struct ct_live *, rows) of the preloaded shim, or None when it is absent."""
    global _view, _looked
    if _looked:
        return _view
    with _lock:
        if _looked:
            return _view
        from . import native

        ffi = native.ffi()
        lib = ffi.dlopen(None)  # the process's global scope: LD_PRELOAD put the shim there
        try:
            ptr = lib.cudatrace_live()
        except (AttributeError, OSError):
            ptr = None
        if ptr is not None and ptr != ffi.NULL:
            c = native.constants()
            if ptr.version != c["CT_LIVE_VERSION"]:
                _mismatch.append(
                    "the loaded shim's live counters have version %d, this package reads %d "
                    "(the shim comes from another cudatrace)" % (ptr.version, c["CT_LIVE_VERSION"])
                )
            else:
                _view = (ffi, lib, ptr, c)
        _looked = True
        return _view


def active() -> bool:
    """Whether cudatrace's shim is loaded in this process and counting."""
    v = _load()
    return v is not None and bool(v[2].active)


def _need() -> _View:
    """The view, its counters summed now (the threads' own counts, live_format.h)."""
    v = _load()
    if v is None:
        raise NotTracedError(*_mismatch[:1])
    if not v[2].active:
        raise NotTracedError(
            "cudatrace's shim is loaded but not counting (CUDATRACE_DIR unset: pass-through)"
        )
    v[1].cudatrace_live()  # sums every thread's counters into the struct v[2] points at
    return v


@dataclass(frozen=True)
class Row:
    """One row of the counters: a device, all devices together, or pinned host memory."""

    live: int  # bytes live now
    peak: int  # the highest live bytes since the process started
    allocs: int  # successful allocations
    frees: int  # counted allocations freed
    failures: int  # allocations the driver refused
    denials: int  # allocations a budget refused


def _row(r: Any) -> Row:  # a struct ct_live_row
    return Row(
        int(r.live), int(r.peak), int(r.allocs), int(r.frees), int(r.failures), int(r.denials)
    )


@dataclass(frozen=True)
class Snapshot:
    devices: dict[int, Row]  # device index -> Row, for devices that ever allocated
    all: Row  # every device together (its peak is the peak of the sum)
    host: Row  # pinned host memory
    untracked: int  # allocations the shim could not count (its table was full)


def snapshot() -> Snapshot:
    """Every row of the counters, read now (each figure whole; rows a moment apart)."""
    _, _, p, c = _need()
    n = c["CT_LIVE_DEVICES"]
    devs = {}
    for d in range(n):
        r = _row(p.dev[d])
        if r.allocs or r.failures or r.denials or r.live:
            devs[d] = r
    return Snapshot(devs, _row(p.dev[c["CT_LIVE_ALL"]]), _row(p.host), int(p.untracked))


def _index(device: int | None, c: Mapping[str, int]) -> int:
    if device is None:
        return c["CT_LIVE_ALL"]
    if not isinstance(device, int) or isinstance(device, bool) or device < 0:
        raise ValueError(f"device must be a device index (0, 1, ...) or None, not {device!r}")
    n = c["CT_LIVE_DEVICES"]
    if device >= n:
        raise ValueError(
            f"the counters keep devices 0 to {n - 1} apart; device {device} is counted only with "
            "every device together (device=None)"
        )
    return device


def stats(device: int | None = None) -> Row:
    """The counters of one device (None: every device together)."""
    _, _, p, c = _need()
    return _row(p.dev[_index(device, c)])


class Mark(Closing):
    """A point to measure from: peak() is the highest live bytes since the mark was made,
    base() what was live when it was made, own() the bytes of the allocations made since then
    that are still live (what was live before and is freed meanwhile does not lower it) and
    own_peak() the highest own() since then. Close it (or use `with`) to free its slot; 64 may
    be open at once, from any threads."""

    def __init__(self) -> None:
        _, lib, p, c = _need()
        slot = lib.cudatrace_live_mark_open()
        if slot < 0:
            raise RuntimeError(
                "cudatrace: %d marks are open already (close marks and track() blocks you "
                "no longer need)" % c["CT_LIVE_MARKS"]
            )
        self._lib, self._p, self._c, self.slot = lib, p, c, slot
        self.opened_ns = int(p.marks[slot].opened_ns)
        self._closed: dict[str, list[int]] | None = None

    def _reading(self, which: str, device: int | None) -> int:
        i = _index(device, self._c)
        if self._closed is not None:
            return self._closed[which][i]
        return max(0, int(getattr(self._p.marks[self.slot], which)[i]))  # own: signed

    def peak(self, device: int | None = None) -> int:
        """The highest live bytes since the mark (a device, or None: all devices together)."""
        return self._reading("peak", device)

    def base(self, device: int | None = None) -> int:
        """Live bytes when the mark was made."""
        return self._reading("base", device)

    def own(self, device: int | None = None) -> int:
        """Bytes of the allocations made since the mark that are still live."""
        return self._reading("own", device)

    def own_peak(self, device: int | None = None) -> int:
        """The highest own() since the mark."""
        return self._reading("own_peak", device)

    def close(self) -> None:
        """Keep the readings and give the slot back (idempotent)."""
        if self._closed is None:
            self._lib.cudatrace_live()
            k = self._p.marks[self.slot]
            rows = range(self._c["CT_LIVE_ROWS"])
            self._closed = {
                name: [max(0, int(getattr(k, name)[i])) for i in rows]
                for name in ("peak", "base", "own", "own_peak")
            }
            self._lib.cudatrace_live_mark_close(self.slot)


def mark() -> Mark:
    """A new mark (see Mark)."""
    return Mark()


@dataclass
class SiteUse:
    """Where a block's device memory came from, attributed as `cudatrace report` does (the
    Python line first where there is one). file/line/function: the line of the block's own function
    the allocations came through when there is one, else the site's frame."""

    label: str  # the site as `cudatrace report` names it: `function (file:line)`
    file: str | None
    line: int | None
    function: str | None
    bytes: int
    count: int
    python: bool
    via: str = ""  # the allocator layers folded into the site, outermost first
    # the heaviest stack of the site, innermost first: (function, file, line); its Python frames
    # alone when it has any
    stack: list[tuple[str | None, str | None, int | None]] = field(default_factory=list)

    def where(self) -> str:
        if self.file:
            return f"{self.file}:{self.line if self.line else '?'}"
        return self.label


@dataclass
class Tracker:
    """The figures of a `with track()` block (all devices together; `devices` per device).
    peak and left are the block's own allocations (made during it, by any thread of the
    process): memory live before it and freed during it lowers neither.

    peak         the highest bytes of the block's own allocations live at one moment
    left         the bytes of the block's own allocations still live at its end
    start_live   live bytes of the process when the block started;  end_live: when it ended
    """

    start_live: int = 0
    end_live: int = 0
    peak: int = 0
    left: int = 0
    start_ns: int = 0
    end_ns: int = 0
    # device -> (peak above start, left)
    devices: dict[int, tuple[int, int]] = field(default_factory=dict)
    # sites() names the lines of this function: (file, name); default: the block's own
    anchor: tuple[str, str] | None = None
    _mark: Mark | None = field(default=None, repr=False)
    _analysis: object = field(default=None, repr=False)

    def __enter__(self) -> Tracker:
        if not self.anchor:  # the code of the `with` statement: its lines name the rows
            code = sys._getframe(1).f_code
            self.anchor = (code.co_filename, code.co_name)
        self._mark = Mark()
        self.start_ns = self._mark.opened_ns
        self.start_live = self._mark.base()
        return self

    def __exit__(self, *exc: object) -> None:
        m = self._mark
        if m is None:
            raise RuntimeError("the track() block was never entered")
        _, _, p, c = _need()
        self.end_ns = time.monotonic_ns()
        m.close()
        self.end_live = int(p.dev[c["CT_LIVE_ALL"]].live)
        self.peak = m.own_peak()
        self.left = m.own()
        for d in range(c["CT_LIVE_DEVICES"]):
            if m.own_peak(d):
                self.devices[d] = (m.own_peak(d), m.own(d))

    def sites(self, at: str = "peak", limit: int = 10) -> list[SiteUse]:
        """The sites of the block's own allocations: live at the block's peak (at="peak") or
        still live at its end (at="end"), largest first; a row per line of the block's file
        (anchor) they came through, with its bytes and count. Read from this process's trace file
        (written as the program runs); empty without a trace (--aggregate, --no-trace)."""
        if at not in ("peak", "end"):
            raise ValueError(f"at must be 'peak' or 'end', not {at!r}")
        if not self.end_ns:
            raise RuntimeError("sites() is read after the block has ended")
        from .analyze.documents import live_sites

        rows = live_sites.block_sites(
            _own_trace(), self.start_ns, self.end_ns, at, limit, self.anchor
        )
        return [SiteUse(**r) for r in rows]

    def children(self) -> list[tuple[int, int]]:
        """[(pid, bytes)] of the processes started from this one (children, and theirs: a
        multiprocessing worker) that allocated device memory during the block, each with the
        most it held at once of what it allocated then. Not in peak or left: those count this
        process, whose counters are its own. Read from their trace files in this run's trace
        directory; empty without one."""
        if not self.end_ns:
            raise RuntimeError("children() is read after the block has ended")
        from .analyze.documents import live_sites

        return live_sites.descendant_peaks(
            settings.value("DIR"), os.getpid(), self.start_ns, self.end_ns
        )


def track(anchor: tuple[str, str] | None = None) -> Tracker:
    """`with cudatrace.track() as t:` measures the block: t.peak, t.left, t.sites()."""
    _need()
    return Tracker(anchor=anchor)


def _own_trace() -> str | None:
    """This process's trace file: <CUDATRACE_DIR>/<pid>.<n>.ctrace, the newest image's."""
    d = settings.value("DIR")
    if not d:
        return None
    files = glob.glob(os.path.join(glob.escape(d), "%d.*.ctrace" % os.getpid()))

    def n(path: str) -> int:
        part = os.path.basename(path).split(".")[1]
        return int(part) if part.isdigit() else -1

    return max(files, key=n) if files else None
