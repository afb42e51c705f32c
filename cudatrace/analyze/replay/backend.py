"""The C replay (native/reader/replay.c, in the tools library): the traces' events merged in one
pass, decoded from a trace's event blocks as it goes (or over the scanner's event array, for
older formats), each allocation's life written once; what is live at a moment, by site, over
windows, asked of those lives afterwards. process_ends gives each process's end, when its
memory goes."""

from __future__ import annotations

import struct
import threading
from typing import Any, Protocol

from ... import native
from ...native_types import ToolsLib
from ..read.trace import Trace, layout
from .lives import (
    DEV,
    NEVER_FREED,
    NFIELDS,
    NONE64,
    SIZE,
    TS,
    Alloc,
    Groups,
    device_kinds,
    host_kinds,
    kinds_mask,
)

_lock = threading.Lock()


_c: tuple[Any, ToolsLib, dict[str, int]] | bool | None = None  # False when unavailable


def c_backend() -> tuple[Any, ToolsLib, dict[str, int]] | None:
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
                c_error[0] = str(e)
        return _c if isinstance(_c, tuple) else None


c_error = [""]


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
    """What a Model asks of a finished replay: the C one (CReplay) or the tests' Python oracle
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


class CReplay:
    name = "c"

    def __init__(self, traces: list[Trace], buckets: int):
        backend = c_backend()
        if backend is None:
            raise RuntimeError(f"the C replay is not available: {c_error[0]}")
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
        cfg.device_kinds = kinds_mask(device_kinds())
        cfg.host_kinds = kinds_mask(host_kinds())
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
