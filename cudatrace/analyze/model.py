"""Replaying traces into live allocations over time: peaks, what is live at a moment, failures.

Counted as device memory: device, pitch, managed, stream-ordered, VMM physical (cuMemCreate),
arrays and graph memory. Pinned host memory is tracked apart (it is host DRAM, except on
unified-memory devices). Imports (IPC, external memory) map memory someone else paid for and
are never counted. A free matches the live allocation of the same process, address space and
address; a free that matches none (memory allocated before tracing, or by an unhooked path) is
counted as unmatched and changes nothing. An allocation at an address still live ends the old
one (counted as reused). cuMemRelease of a VMM handle that is still mapped frees nothing until
its last cuMemUnmap, as in the driver. Failed allocations are listed, never counted.

A process's memory ends when the process ends: when the launcher saw it gone (record/exits.py),
else at its exit record, or when exec replaced its image (the next image's start), whatever it
still held is gone, as the driver gives it back. A process that left no end (killed, still
running) holds its memory to the end of the run. The
run's end figure (`end_bytes`, `live_at_end`) is what was never freed: live at the end, or held
by its process when that process ended.

The events of all processes are merged by timestamp (ties: a process's end first, then trace
order). One pass records every
allocation's lifetime, so what is live at the peak, at the end or at any time is a filter, not
a second replay. The pass runs in C (native/reader/replay.c, in the tools library), decoding a
trace's event blocks as it goes (or over the scanner's event array, for older formats). The same rules written in Python (tests/support/replay_oracle.py) are the reference
the tests hold the C to; the product uses the C replay only.
"""

from __future__ import annotations

import struct
import threading
from collections import Counter
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from .. import native
from ..native_types import ToolsLib
from .trace import C, Trace, TraceDir, event_fields, layout

T = TypeVar("T")

_F = {name: i for i, name in enumerate(event_fields())}
TS, SIZE, ADDR, AUX, AUX2, TID, DEV, RES, STACK, API, RT, OP, KIND, SPACE, FLAGS = (
    _F[n]
    for n in (
        "ts_ns",
        "size",
        "addr",
        "aux",
        "aux2",
        "tid",
        "device",
        "result",
        "stack",
        "api",
        "rt_api",
        "op",
        "kind",
        "space",
        "flags",
    )
)
NFIELDS = len(_F)
NONE64 = (1 << 64) - 1
NEVER_FREED = "never_freed"  # a `by_ts` value of the backends' queries: never freed
TIMELINE_BUCKETS = 4096

KIND_NAMES = {
    "CT_KIND_DEVICE": "device",
    "CT_KIND_PITCH": "pitch",
    "CT_KIND_MANAGED": "managed",
    "CT_KIND_ASYNC": "async",
    "CT_KIND_HOST": "host",
    "CT_KIND_VMM": "vmm",
    "CT_KIND_ARRAY": "array",
    "CT_KIND_GRAPH": "graph",
    "CT_KIND_IMPORT": "import",
    "CT_KIND_NONE": "none",
}


def kind_name(k: int) -> str:
    for n, v in C().items():
        if n.startswith("CT_KIND_") and v == k:
            return KIND_NAMES.get(n, n)
    return "kind%d" % k


def device_kinds() -> set[int]:
    K = C()
    return {
        K[n]
        for n in (
            "CT_KIND_DEVICE",
            "CT_KIND_PITCH",
            "CT_KIND_MANAGED",
            "CT_KIND_ASYNC",
            "CT_KIND_VMM",
            "CT_KIND_ARRAY",
            "CT_KIND_GRAPH",
        )
    }


def host_kinds() -> set[int]:
    return {C()["CT_KIND_HOST"]}


# Alloc.how: why a life ended (END_EXITED: its process ended holding it)
END_LIVE, END_FREE, END_REUSED, END_UNMAPPED, END_EXITED = 0, 1, 2, 3, 4


class Alloc:
    """One event of the replay (an allocation, a failure, a denial, a memory query) and, for a
    device allocation, when it ended (end_ts None: still live when its trace ended)."""

    __slots__ = ("trace", "event", "size", "ts", "device", "index", "seq", "end_ts", "how")

    def __init__(
        self,
        trace: int,
        event: tuple[Any, ...],
        size: int,
        ts: int,
        device: int,
        index: int = -1,
        seq: int = -1,
        end_ts: int | None = None,
        how: int = 0,
    ):
        self.trace = trace
        self.event = event
        self.size = size
        self.ts = ts
        self.device = device
        self.index = index
        self.seq = seq
        self.end_ts = end_ts
        self.how = how

    @property
    def api(self) -> int:
        result: int = self.event[API]
        return result

    @property
    def rt_api(self) -> int:
        result: int = self.event[RT]
        return result

    @property
    def stack(self) -> int:
        result: int = self.event[STACK]
        return result

    @property
    def result(self) -> int:
        result: int = self.event[RES]
        return result

    @property
    def kind(self) -> int:
        result: int = self.event[KIND]
        return result

    @property
    def flags(self) -> int:
        result: int = self.event[FLAGS]
        return result

    def __repr__(self) -> str:
        return "Alloc(trace=%d, size=%d, ts=%d, device=%d, addr=0x%x)" % (
            self.trace,
            self.size,
            self.ts,
            self.device,
            self.event[ADDR],
        )


class Groups:
    """Allocations live at a moment, grouped by (trace, stack, api, rt_api, device): what site
    grouping needs without one Python object per allocation. rows: tuples (trace, stack, api,
    rt_api, device, count, bytes, first_ts, last_ts, sizes) where sizes is a sorted sequence
    (a list, or a memoryview on the C replay's array)."""

    __slots__ = ("rows", "bytes", "count", "keep")

    def __init__(self, rows: list[tuple[Any, ...]], keep: object = None) -> None:
        self.rows = rows
        self.bytes = sum(r[6] for r in rows)
        self.count = sum(r[5] for r in rows)
        self.keep = keep  # what the memoryviews look into

    @classmethod
    def of(cls, allocs: Iterable[Alloc], results: bool = False) -> Groups:
        """results: add an 11th column, a Counter of non-zero CUresults (failed allocations)."""
        g: dict[tuple[Any, ...], list[Any]] = {}
        for a in allocs:
            e = a.event
            k = (a.trace, e[STACK], e[API], e[RT], e[DEV])
            x = g.get(k)
            if x is None:
                x = g[k] = [0, 0, a.ts, a.ts, [], Counter()]
            x[0] += 1
            x[1] += a.size
            if a.ts < x[2]:
                x[2] = a.ts
            if a.ts > x[3]:
                x[3] = a.ts
            x[4].append(a.size)
            if results and e[RES]:
                x[5][e[RES]] += 1
        order = sorted(g.items(), key=lambda kv: kv[0][:4] + (kv[0][4] & 0xFFFFFFFF,))  # as C sorts
        extra = (lambda x: (x[5],)) if results else (lambda x: ())
        return cls([k + (x[0], x[1], x[2], x[3], sorted(x[4])) + extra(x) for k, x in order])

    def plain(self) -> list[tuple[Any, ...]]:
        """rows with the sizes as lists (to compare, to print)."""
        return [r[:9] + (list(r[9]),) for r in self.rows]

    def by_trace(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.rows:
            out[r[0]] = out.get(r[0], 0) + r[6]
        return out

    def by_device(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.rows:
            out[r[4]] = out.get(r[4], 0) + r[6]
        return out

    def only(self, traces: Container[int] | None = None, device: int | None = None) -> Groups:
        return Groups(
            [
                r
                for r in self.rows
                if (traces is None or r[0] in traces) and (device is None or r[4] == device)
            ],
            self.keep,
        )

    def __len__(self) -> int:
        result: int = self.count
        return result


# ---- the C replay ------------------------------------------------------------------------

_lock = threading.Lock()
_c: tuple[Any, ToolsLib, dict[str, int]] | bool | None = None  # False when unavailable


def _c_backend() -> tuple[Any, ToolsLib, dict[str, int]] | None:
    """(ffi, lib, constants) of the C replay, or None (no library, or built without it)."""
    global _c
    with _lock:
        if _c is None:
            _c = False
            try:
                ffi, lib = native.tools()
                _ = lib.ct_replay_run  # a library built before replay.c: fall back
                consts = native.defines(native.cffi_part(native.header_text("replay.h")))
                _c = (ffi, lib, consts)
            except (RuntimeError, OSError, AttributeError, ImportError) as e:  # pragma: no cover
                _c = False
                _c_error[0] = str(e)
        return _c if isinstance(_c, tuple) else None


_c_error = [""]


def process_ends(traces: list[Trace]) -> list[int]:
    """When each trace's process (image) ended, 0 when unknown: when the launcher saw the process
    exit, if it did, and else its exit record; or for an image that exec replaced, the start of
    the next image of the same process (pid and start time). An exit record is written before
    the process is gone, and the driver gives its memory back only then (a budget's ledger, too,
    reclaims a member that did not leave once it sees it gone): what it held counts until the
    launcher saw it end."""
    starts: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    for t in traces:
        key = (t.pid, getattr(t, "start_ticks", 0))
        starts.setdefault(key, []).append((t.exec_index, t.start_monotonic_ns))
    out = []
    for t in traces:
        end = getattr(t, "end", None)
        if end is not None:
            out.append(max(int(end.ts_ns), getattr(t, "exit_seen_ns", 0), 1))
            continue
        later = [
            s for i, s in starts.get((t.pid, getattr(t, "start_ticks", 0)), []) if i > t.exec_index
        ]
        if later and getattr(t, "status", "") == "exec":
            out.append(min(later))
        else:
            out.append(getattr(t, "exit_seen_ns", 0))
    return out


class Replay(Protocol):
    """What a Model asks of a finished replay: the C one (_CReplay) or the tests' Python oracle
    (tests/support/replay_oracle.py). by_ts: True (a time), False (an event's seq) or
    NEVER_FREED; device None: every device."""

    def select(self, by_ts: bool | str, value: int, device: int | None = None) -> list[Alloc]: ...
    def groups(self, by_ts: bool | str, value: int, device: int | None = None) -> Groups: ...
    def live_bytes(
        self, by_ts: bool | str, value: int, device: int | None = None
    ) -> tuple[int, int]: ...
    def bytes_at(self, times: list[int], device: int | None = None) -> list[int]: ...
    def bytes_max(self, lo: list[int], hi: list[int], device: int | None = None) -> list[int]: ...
    def all(self) -> list[Alloc]: ...
    def stack_totals(self) -> dict[tuple[int, int], tuple[int, int]]: ...
    def listed(self, which: str) -> list[Alloc]: ...
    def timeline(self, device: int | None = None) -> list[tuple[Any, ...]]: ...


def _mask(kinds: Iterable[int]) -> int:
    m = 0
    for k in kinds:
        m |= 1 << min(k, 63)
    return m


class _CReplay:
    name = "c"

    def __init__(self, traces: list[Trace], buckets: int):
        backend = _c_backend()
        if backend is None:
            raise RuntimeError(f"the C replay is not available: {_c_error[0]}")
        ffi, lib, K = backend
        self.ffi, self.lib, self.K = ffi, lib, K
        self.keep = []
        arr = ffi.new("struct ct_replay_trace[]", max(len(traces), 1))
        es = layout("struct ct_event")[0]
        ends = process_ends(traces)
        for i, t in enumerate(traces):
            arr[i].end_ts = ends[i]
            src = getattr(t, "source_blocks", None)
            if src is not None and src.index is not None and getattr(t, "_raw", None) is None:
                ix = src.index  # decoded by the replay from the file's blocks, as it goes
                arr[i].buf = src.buf
                arr[i].len = src.size
                arr[i].segs = ix.segs
                arr[i].n_segs = ix.n_segs
                arr[i].min_ts, arr[i].max_ts = ix.min_ts, ix.max_ts
                arr[i].droppable = 1 if src.droppable else 0
                arr[i].n = t.n_events
                self.keep.append(src)
                continue
            raw = getattr(t, "raw_events", None)
            n = getattr(t, "n_events", 0) if raw is not None else 0
            if raw is None:  # events given as tuples: pack them for C
                evs = t.events
                n = len(evs)
                buf = bytearray(es.size * max(n, 1))
                for k, e in enumerate(evs):
                    es.pack_into(buf, k * es.size, *e)
                raw = ffi.from_buffer("struct ct_event[]", buf)
                self.keep.append(buf)
            self.keep.append(raw)
            arr[i].events = raw
            arr[i].n = n
        self.keep.append(arr)
        cfg = ffi.new("struct ct_replay_config *")
        cfg.device_kinds = _mask(device_kinds())
        cfg.host_kinds = _mask(host_kinds())
        cfg.buckets = buckets
        s = ffi.new("struct ct_replay_summary *")
        h = lib.ct_replay_run(arr, len(traces), cfg, s)
        self.keep = []  # the replay holds no event after its pass: the queries read its lives
        if h == ffi.NULL:
            raise MemoryError("replaying the trace ran out of memory")
        self.h = ffi.gc(h, lib.ct_replay_free)
        self.buckets = buckets
        c = s.c
        self.counts = {
            name: int(getattr(c, name)) for name, _ in ffi.typeof("struct ct_replay_counts").fields
        }
        self.summary = {
            name: int(getattr(s, name))
            for name, _ in ffi.typeof("struct ct_replay_summary").fields
            if name != "c"
        }
        self.devices = {}
        d = ffi.new("struct ct_replay_device *")
        for slot in range(K["CT_REPLAY_DEV_SLOTS"]):
            if lib.ct_replay_device(self.h, slot, d):
                self.devices[d.device] = {
                    "allocs": d.allocs,
                    "peak_bytes": d.peak_bytes,
                    "peak_ts": d.peak_ts,
                    "peak_seq": d.peak_seq,
                    "end_bytes": d.end_bytes,
                }
        self.procs = []
        p = ffi.new("struct ct_replay_proc *")
        for i in range(len(traces)):
            lib.ct_replay_proc(self.h, i, p)
            self.procs.append(
                {
                    name: int(getattr(p, name))
                    for name, _ in ffi.typeof("struct ct_replay_proc").fields
                }
            )
        lf = es.format.lstrip("<@=!>") + "IIQQQII"
        self._live = struct.Struct("<" + lf)
        assert self._live.size == ffi.sizeof("struct ct_live"), "struct ct_live layout"

    def _allocs(self, buf: Any, n: int) -> list[Alloc]:
        out: list[Alloc] = []
        if not n:
            return out
        append = out.append
        for u in self._live.iter_unpack(self.ffi.buffer(buf, self._live.size * n)):
            ev = u[:NFIELDS]
            end_ts = u[NFIELDS + 4]
            append(
                Alloc(
                    u[NFIELDS],
                    ev,
                    ev[SIZE],
                    ev[TS],
                    ev[DEV],
                    u[NFIELDS + 1],
                    u[NFIELDS + 2],
                    None if end_ts == NONE64 else end_ts,
                    u[NFIELDS + 5],
                )
            )
        return out

    def _dev(self, device: int | None) -> int:
        return self.K["CT_REPLAY_ANY_DEVICE"] if device is None else int(device)

    def _by(self, by_ts: bool | object) -> int:
        if by_ts == NEVER_FREED:
            return self.K["CT_REPLAY_NEVER_FREED"]
        return self.K["CT_REPLAY_BY_TS"] if by_ts else self.K["CT_REPLAY_BY_SEQ"]

    def select(self, by_ts: bool, value: int, device: int | None = None) -> list[Alloc]:
        by = self._by(by_ts)
        value = max(0, min(int(value), NONE64))
        n = self.lib.ct_replay_select(self.h, by, value, self._dev(device), self.ffi.NULL, 0)
        buf = self.ffi.new("struct ct_live[]", max(n, 1))
        self.lib.ct_replay_select(self.h, by, value, self._dev(device), buf, n)
        return self._allocs(buf, n)

    def groups(self, by_ts: bool, value: int, device: int | None = None) -> Groups:
        by = self._by(by_ts)
        value = max(0, min(int(value), NONE64))
        _, n = self.live_bytes(by_ts, value, device)
        out = self.ffi.new("struct ct_group[]", max(n, 1))
        sizes = self.ffi.new("uint64_t[]", max(n, 1))
        ng = self.lib.ct_replay_groups(self.h, by, value, self._dev(device), out, n, sizes, n)
        if ng == NONE64:
            raise MemoryError("grouping allocations ran out of memory")
        allsizes = memoryview(self.ffi.buffer(sizes)).cast("B").cast("Q")  # no copy
        rows = []
        for i in range(ng):
            g = out[i]
            o, c = g.sizes, g.count
            rows.append(
                (
                    g.trace,
                    g.stack,
                    g.api,
                    g.rt_api,
                    g.device,
                    c,
                    g.bytes,
                    g.first_ts,
                    g.last_ts,
                    allsizes[o : o + c],
                )
            )
        return Groups(rows, keep=sizes)

    def live_bytes(self, by_ts: bool, value: int, device: int | None = None) -> tuple[int, int]:
        by = self._by(by_ts)
        cnt = self.ffi.new("uint64_t *")
        b = self.lib.ct_replay_live_bytes(
            self.h, by, max(0, min(int(value), NONE64)), self._dev(device), cnt
        )
        return int(b), int(cnt[0])

    def bytes_at(self, times: list[int], device: int | None = None) -> list[int]:
        n = len(times)
        if not n:
            return []
        ts = self.ffi.new("uint64_t[]", [max(0, min(int(t), NONE64)) for t in times])
        out = self.ffi.new("uint64_t[]", n)
        self.lib.ct_replay_bytes_at(self.h, ts, n, self._dev(device), out)
        return list(self.ffi.unpack(out, n))

    def bytes_max(self, lo: list[int], hi: list[int], device: int | None = None) -> list[int]:
        n = len(lo)
        if not n:
            return []
        clamp = [max(0, min(int(t), NONE64)) for t in lo + hi]
        a = self.ffi.new("uint64_t[]", clamp[:n])
        b = self.ffi.new("uint64_t[]", clamp[n:])
        out = self.ffi.new("uint64_t[]", n)
        if self.lib.ct_replay_bytes_max(self.h, a, b, n, self._dev(device), out) < 0:
            raise MemoryError("the traced bytes over the samples' windows ran out of memory")
        return list(self.ffi.unpack(out, n))

    def all(self) -> list[Alloc]:
        n = self.lib.ct_replay_all(self.h, self.ffi.NULL, 0)
        buf = self.ffi.new("struct ct_live[]", max(n, 1))
        self.lib.ct_replay_all(self.h, buf, n)
        return self._allocs(buf, n)

    def stack_totals(self) -> dict[tuple[int, int], tuple[int, int]]:
        n = self.lib.ct_replay_stack_totals(self.h, self.ffi.NULL, 0)
        buf = self.ffi.new("struct ct_stack_total[]", max(n, 1))
        n = self.lib.ct_replay_stack_totals(self.h, buf, n)
        return {
            (buf[i].trace, buf[i].stack): (int(buf[i].count), int(buf[i].bytes)) for i in range(n)
        }

    def listed(self, which: str) -> list[Alloc]:
        w = self.K["CT_REPLAY_LIST_" + which.upper()]
        n = self.lib.ct_replay_list(self.h, w, self.ffi.NULL, 0)
        buf = self.ffi.new("struct ct_live[]", max(n, 1))
        self.lib.ct_replay_list(self.h, w, buf, n)
        return self._allocs(buf, n)

    def timeline(self, device: int | None = None) -> list[tuple[int, ...]]:
        if not self.buckets:
            return []
        buf = self.ffi.new("struct ct_replay_bucket[]", self.buckets)
        n = self.lib.ct_replay_timeline(self.h, self._dev(device), buf, self.buckets)
        return [
            (b.changes, b.min, b.min_ts, b.max, b.max_ts, b.last, b.last_ts)
            for b in (buf[i] for i in range(n))
            if b.changes
        ]


# ---- the model ----------------------------------------------------------------------------


@dataclass
class Model:
    traces: list[Trace]
    backend: Replay = field(repr=False)
    found: bool = False  # any device allocation at all
    peak_bytes: int = 0
    peak_ts: int = 0
    peak_seq: int = -1
    end_bytes: int = 0
    device_peaks: dict[int, tuple[int, int]] = field(default_factory=dict)  # dev -> (bytes, ts)
    device_peak_seq: dict[int, int] = field(default_factory=dict)
    device_end: dict[int, int] = field(default_factory=dict)
    device_allocs: dict[int, int] = field(default_factory=dict)
    host_peak: int = 0
    host_peak_ts: int = 0
    host_end: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    procs: list[dict[Any, Any]] = field(default_factory=list)  # per trace: allocs, peak_bytes, ...
    t0: int = 0
    t_end: int = 0
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def peak_index(self) -> int:
        """Merged index of the event that reached the peak; -1 when nothing was allocated."""
        return self.peak_seq if self.found else -1

    @property
    def unmatched_frees(self) -> int:
        return self.counts.get("unmatched_frees", 0)

    @property
    def n_events(self) -> int:
        return self.counts.get("events", 0)

    def _cached(self, key: object, fn: Callable[[], T]) -> T:
        if key not in self._cache:
            self._cache[key] = fn()
        return cast(T, self._cache[key])

    @property
    def live_at_peak(self) -> list[Alloc]:
        """Device allocations live right after the event that reached the peak."""
        if not self.found:
            return []
        return self._cached(("peak", None), lambda: self.backend.select(False, self.peak_seq))

    @property
    def live_at_end(self) -> list[Alloc]:
        """Device allocations never freed (live when the traces end)."""
        return self._cached(("end", None), lambda: self.backend.select(NEVER_FREED, 0))

    def live_at_device_peak(self, device: int) -> list[Alloc]:
        """Allocations on device live at that device's own peak."""
        if device not in self.device_peak_seq:
            return []
        seq = self.device_peak_seq[device]
        return self._cached(("dpeak", device), lambda: self.backend.select(False, seq, device))

    def groups_at_peak(self, device: int | None = None) -> Groups:
        """live_at_peak (or a device's own peak), grouped."""
        if device is None:
            if not self.found:
                return Groups([])
            return self._cached(("gpeak", None), lambda: self.backend.groups(False, self.peak_seq))
        if device not in self.device_peak_seq:
            return Groups([])
        seq = self.device_peak_seq[device]
        return self._cached(("gpeak", device), lambda: self.backend.groups(False, seq, device))

    def groups_at_end(self, device: int | None = None) -> Groups:
        return self._cached(("gend", device), lambda: self.backend.groups(NEVER_FREED, 0, device))

    def groups_at(self, ts: int, device: int | None = None) -> Groups:
        return self.backend.groups(True, ts, device)

    def at(self, ts: int, device: int | None = None) -> list[Alloc]:
        """Allocations live at monotonic time ts (every event at or before ts replayed)."""
        return self.backend.select(True, ts, device)

    def at_seq(self, seq: int, device: int | None = None) -> list[Alloc]:
        return self.backend.select(False, seq, device)

    def live_bytes_at(self, ts: int, device: int | None = None) -> tuple[int, int]:
        """(bytes, count) live at monotonic time ts."""
        return self.backend.live_bytes(True, ts, device)

    def bytes_at(self, times: list[int], device: int | None = None) -> list[int]:
        """Traced live bytes at each of the given monotonic times (ascending)."""
        return self.backend.bytes_at(list(times), device)

    def bytes_max(self, lo: list[int], hi: list[int], device: int | None = None) -> list[int]:
        """The most traced bytes live at any one moment of each window [lo[k], hi[k]] (lo and
        hi each ascending, equal lengths): what the trace held while a reading made somewhere in
        the window was taken."""
        if len(lo) != len(hi):
            raise ValueError("bytes_max: %d window starts, %d ends" % (len(lo), len(hi)))
        if any(a > b for a, b in zip(lo, lo[1:])) or any(a > b for a, b in zip(hi, hi[1:])):
            raise ValueError("bytes_max: the windows' starts and ends must each ascend")
        return self.backend.bytes_max(list(lo), list(hi), device)

    def lifetimes(self) -> list[Alloc]:
        """Every device allocation of the run, with end_ts (None: never freed)."""
        return self._cached(("all", None), self.backend.all)

    def stack_totals(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(trace, leaf stack) -> (count, bytes) of every device allocation of the run."""
        return self._cached(("stacktotals", None), self.backend.stack_totals)

    @property
    def failed(self) -> list[Alloc]:
        return self._cached(("failed", None), lambda: self.backend.listed("failed"))

    @property
    def denied(self) -> list[Alloc]:
        return self._cached(("denied", None), lambda: self.backend.listed("denied"))

    @property
    def meminfo(self) -> list[Alloc]:
        """cuMemGetInfo / NVML memory queries (size: total reported, event[ADDR]: free reported,
        event[AUX] / event[AUX2]: the device's own free / total)."""
        return self._cached(("meminfo", None), lambda: self.backend.listed("meminfo"))

    def timeline_buckets(self, device: int | None = None) -> list[tuple[Any, ...]]:
        """(changes, min, min_ts, max, max_ts, last, last_ts) of each time slice with changes."""
        return self._cached(("tlb", device), lambda: self.backend.timeline(device))

    def timeline_points(self, device: int | None = None) -> list[tuple[int, int]]:
        """(ts, live bytes) steps: each slice's lowest, highest and last value, in time order;
        exact at every slice's extremes (the peak included)."""

        def make() -> list[tuple[int, int]]:
            pts = [(self.t0, 0)]
            for _n, lo, lo_ts, hi, hi_ts, last, last_ts in self.timeline_buckets(device):
                for p in sorted(
                    {(lo_ts, lo), (hi_ts, hi), (last_ts, last)},
                    key=lambda x: (x[0], x == (last_ts, last)),
                ):
                    if p != pts[-1]:
                        pts.append(p)
            return pts

        return self._cached(("tlp", device), make)

    @property
    def timeline(self) -> list[tuple[int, int]]:
        return self.timeline_points()


def build(td: TraceDir | list[Trace], timeline_buckets: int = TIMELINE_BUCKETS) -> Model:
    """Replay the traces of a run (in C: native/reader/replay.c)."""
    traces = td.traces if isinstance(td, TraceDir) else list(td)
    if not _c_backend():
        raise RuntimeError(f"the C replay is not available: {_c_error[0]}")
    if any(getattr(t, "snap_slots", None) for t in traces):
        from .aggregate import apply_snapshots  # --aggregate: events from the last snapshot

        for t in traces:
            apply_snapshots(t)
    m = from_replay(traces, _CReplay(traces, timeline_buckets))
    if any(getattr(t, "aggregate", None) is not None for t in traces):
        from .aggregate import adjust_model  # counts of the run, not of the synthetic events

        adjust_model(m)
    return m


def from_replay(traces: list[Trace], r: Any) -> Model:
    """The Model over a finished replay r (the C one, or the tests' Python oracle)."""
    s = r.summary
    m = Model(
        traces=traces,
        backend=r,
        found=bool(s["found"]),
        peak_bytes=s["peak_bytes"],
        peak_ts=s["peak_ts"],
        peak_seq=s["peak_seq"] if s["found"] else -1,
        end_bytes=s["end_bytes"],
        host_peak=s["host_peak"],
        host_peak_ts=s["host_peak_ts"],
        host_end=s["host_end"],
        counts=dict(r.counts),
        procs=r.procs,
        t0=s["t0"],
        t_end=s["t_end"],
    )
    for dev, d in sorted(r.devices.items()):
        m.device_peaks[dev] = (d["peak_bytes"], d["peak_ts"])
        m.device_peak_seq[dev] = d["peak_seq"]
        m.device_end[dev] = d["end_bytes"]
        m.device_allocs[dev] = d["allocs"]
    return m
